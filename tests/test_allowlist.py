"""The plugin allowlist (pipeline/config/plugins.py), called directly: what is refused, where it says so,
and the advice it gives. tests/test_security.py covers the same through configs and the CLI."""

from __future__ import annotations

import os.path

import pytest

from pipeline.config.args import ConfigError
from pipeline.config.plugins import PluginImportError, TargetNotAllowedError, _check_tree, allowed_targets, check_allowed, load_object

pytestmark = pytest.mark.timeout(30)

ALLOWED = ("pipeline.", "builtins.dict")


@pytest.mark.parametrize("target", ["pipeline.config.plugins.load_object", "builtins.dict",
                                    "builtins.dict.fromkeys"])
def test_allowed_targets_pass(target):
    check_allowed(target, ALLOWED)


@pytest.mark.parametrize("target", ["pipelinex.evil", "builtins.dictx", "builtins.eval", "os.system", "mypkg.fn"])
def test_other_targets_are_refused(target):
    with pytest.raises(TargetNotAllowedError, match=rf"^plugin: target '{target}' is not allowed; allowed module "
                                                     r"prefixes are \['pipeline\.', 'builtins\.dict'\]; "):
        check_allowed(target, ALLOWED)


def test_the_advice_depends_on_stdlib_or_own_code():
    with pytest.raises(TargetNotAllowedError, match=r"reward.path: .*standard-library module 'os' is not a plugin "
                                                     r"package \(allowed_targets_extra is for your own packages\)$"):
        check_allowed("os.path.join", ALLOWED, "reward.path")
    with pytest.raises(TargetNotAllowedError, match=r"add its package with allowed_targets_extra=\[mypkg\.\]$"):
        check_allowed("mypkg.sub.fn", ALLOWED)
    with pytest.raises(TargetNotAllowedError, match=r"allowed module prefixes are \[\]"):
        check_allowed("pipeline.x", None)


def test_a_path_that_resolves_outside_the_allowlist_is_refused():
    # pipeline.process.atomic imports os: "pipeline.process.atomic.os" is the os module, "...os.path.join" posixpath.join
    with pytest.raises(TargetNotAllowedError, match=r"^rollout \('pipeline.process.atomic.os' resolves to 'os'\): "
                                                     r"target 'os' is not allowed"):
        load_object("pipeline.process.atomic.os", ALLOWED, "rollout")
    with pytest.raises(TargetNotAllowedError, match=rf"^plugin \('pipeline.process.atomic.os.path.join' resolves to "
                                                     rf"'{os.path.join.__module__}.join'\)"):
        load_object("pipeline.process.atomic.os.path.join", ALLOWED)
    assert load_object("pipeline.config.plugins.load_object", ALLOWED) is load_object


def test_load_object_errors_name_the_place():
    for bad in ("nodots", 3):
        with pytest.raises(ConfigError, match=r"^eval: expected a dotted path 'pkg.mod.name', got "):
            load_object(bad, ALLOWED, "eval")
    with pytest.raises(PluginImportError, match=r"^plugin: cannot import 'pipeline.nope.fn': ModuleNotFoundError"):
        load_object("pipeline.nope.fn", ALLOWED)
    with pytest.raises(PluginImportError, match=r"^plugin: cannot import 'pipeline.config.plugins.nope': module "
                                                 r"'pipeline.config.plugins' has no attribute 'nope'$"):
        load_object("pipeline.config.plugins.nope", ALLOWED)
    with pytest.raises(ConfigError, match=r"^plugin: expected a dotted path 'pkg.mod.name', got 'nodots'$"):
        load_object("nodots", ALLOWED)
    # a nested path (pkg.mod.Class.attr) names the place too when what it resolves to is refused
    with pytest.raises(TargetNotAllowedError, match=r"^eval \('pipeline.process.atomic.os.path.join' resolves to "):
        load_object("pipeline.process.atomic.os.path.join", ALLOWED, "eval")


def test_a_path_that_resolves_inside_the_allowlist_elsewhere_loads():
    # pipeline.stages.train_data imports Sample from pipeline.samples.sample: another allowed module
    from pipeline.samples.sample import Sample

    assert load_object("pipeline.stages.train_data.Sample", ALLOWED) is Sample
    assert load_object("pipeline.stages.train_data.Sample.Status", ALLOWED) is Sample.Status  # nested: one level up


def test_only_modules_functions_and_classes_are_traced_to_their_origin(monkeypatch):
    """Data (even with a __qualname__) and callables without a __qualname__ (a functools.partial)
    have no defining module to check: the allowed path is what counts."""
    import functools
    import sys
    import types

    probe = types.ModuleType("pipeline.allowlist_probe")
    probe.data = types.SimpleNamespace(__module__="os", __qualname__="system")  # not callable
    probe.bound = functools.partial(dict, a=1)  # callable, no __qualname__
    monkeypatch.setitem(sys.modules, "pipeline.allowlist_probe", probe)
    assert load_object("pipeline.allowlist_probe.data", ALLOWED) is probe.data
    assert load_object("pipeline.allowlist_probe.bound", ALLOWED) is probe.bound


def test_check_tree_finds_targets_at_any_depth_and_names_them():
    tree = {"engine": {"kw": [{"ok": 1}, {"_target_": "os.system"}]}}
    with pytest.raises(TargetNotAllowedError, match=r"^engine.kw\[1\]: target 'os.system' is not allowed"):
        _check_tree(tree, ALLOWED, "")
    with pytest.raises(TargetNotAllowedError, match=r"^root.a \('pipeline.process.atomic.os' resolves to 'os'\)"):
        _check_tree({"a": {"_target_": "pipeline.process.atomic.os"}}, ALLOWED, "root")
    _check_tree({"a": {"_target_": "pipeline.config.plugins.load_object", "b": [1, {"c": 2}]}}, ALLOWED, "")


def test_allowed_targets_adds_the_extra_prefixes():
    assert allowed_targets({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["mine."]}) == ("pipeline.",
                                                                                                       "mine.")
    assert allowed_targets({"allowed_targets": ["pipeline."], "allowed_targets_extra": None}) == ("pipeline.",)


def test_allowed_targets_from_an_args_view_without_the_keys_is_no_check():
    from types import SimpleNamespace

    assert allowed_targets(SimpleNamespace()) is None  # a plugin's own args namespace: nothing to check
    assert allowed_targets(SimpleNamespace(allowed_targets=["pipeline."])) == ("pipeline.",)


def test_a_package_a_plugin_module_imports_is_named_with_the_file_and_line(tmp_path, monkeypatch):
    pkg = tmp_path / "rp_fake_grader_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("import os\n")
    (pkg / "grader.py").write_text("import re\nfrom . import helpers\nimport no_such_dep_xyz.sub\n\n\ndef fn():\n    pass\n")
    (pkg / "own.py").write_text("from rp_fake_grader_pkg import missing_sibling\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginImportError) as err:
        load_object("rp_fake_grader_pkg.grader.fn", ("rp_fake_grader_pkg.",), "reward")
    assert str(err.value) == (
        f"reward: cannot import 'rp_fake_grader_pkg.grader.fn': ModuleNotFoundError: No module named 'no_such_dep_xyz'; "
        f"{pkg / 'grader.py'} line 3 imports 'no_such_dep_xyz', which is not installed in this environment: "
        f"pip install no_such_dep_xyz (or the distribution that provides it)")
    with pytest.raises(PluginImportError) as err:  # a module of the plugin's own package: the error says it all
        load_object("rp_fake_grader_pkg.own.fn", ("rp_fake_grader_pkg.",), "reward")
    assert str(err.value).endswith("ImportError: cannot import name 'missing_sibling' from 'rp_fake_grader_pkg' "
                                   f"({pkg / '__init__.py'})")
