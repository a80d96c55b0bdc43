"""The module paths from before the subpackage layout (issue #32) still import, as deprecated
aliases of their new homes (`pipeline.MOVED`): stored run configs, pickles and user plugins that
name `pipeline.sample`, `pipeline.plugins`, `pipeline.data.slime_compat`, ... keep working."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import subprocess
import re
import sys
from pathlib import Path

import hydra.utils
import pytest

import pipeline
from pipeline.config.plugins import load_object
from pipeline.samples.sample import Sample

ROOT = Path(pipeline.__file__).resolve().parent


@pytest.mark.parametrize("old, new", sorted(pipeline.MOVED.items()))
def test_old_path_imports_the_new_module_with_a_deprecation_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module
    for name in getattr(module, "__all__", ()):
        assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old, new", sorted(pipeline.MOVED.items()))
def test_the_old_path_is_no_file_and_the_new_one_is(old, new):
    # a leftover file at the old path would shadow the alias with a second copy of the module
    assert not (ROOT.parent / (old.replace(".", "/") + ".py")).exists()
    assert not (ROOT.parent / old.replace(".", "/")).is_dir()
    origin = Path(importlib.util.find_spec(new).origin)
    assert origin.is_relative_to(ROOT) and origin.parent != ROOT  # inside a subpackage


def test_old_dotted_paths_in_a_stored_config_still_load(monkeypatch):
    monkeypatch.delitem(sys.modules, "pipeline.sample", raising=False)
    with pytest.warns(DeprecationWarning):
        assert load_object("pipeline.sample.Sample", allowed=("pipeline.",), where="custom") is Sample
    # hydra walks attributes first: a module imported before is an attribute of the package
    monkeypatch.delitem(sys.modules, "pipeline.sample_meta", raising=False)
    monkeypatch.delattr(pipeline, "sample_meta", raising=False)
    with pytest.warns(DeprecationWarning):
        status = hydra.utils.get_object("pipeline.sample_meta.SampleStatus")
    assert status is Sample.Status


def test_a_pickle_naming_the_old_module_loads_the_same_class(monkeypatch):
    data = pickle.dumps(Sample(prompt="p", response="r", reward=1.0), protocol=0)
    assert b"pipeline.samples.sample" in data
    old = data.replace(b"pipeline.samples.sample", b"pipeline.sample")
    monkeypatch.delitem(sys.modules, "pipeline.sample", raising=False)
    with pytest.warns(DeprecationWarning):
        loaded = pickle.loads(old)
    assert type(loaded) is Sample and (loaded.prompt, loaded.response, loaded.reward) == ("p", "r", 1.0)


def test_the_old_config_module_names_resolve_from_the_package(monkeypatch):
    import pipeline.config
    from pipeline.config import args

    for name in ("validate", "SlimeArgs", "ConfigError"):
        monkeypatch.delitem(vars(pipeline.config), name, raising=False)
        with pytest.warns(DeprecationWarning, match=f"pipeline.config.args.{name}"):
            assert getattr(pipeline.config, name) is getattr(args, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        pipeline.config.nothing_here  # noqa: B018


def test_python_dash_m_with_the_old_path_runs_the_new_module():
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "pipeline.config_docs", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT.parent)
    assert done.returncode == 0, done.stderr
    assert "--check" in done.stdout  # the groups-table generator's own usage
    assert "pipeline.config_docs moved to pipeline.config.docs" in done.stderr
