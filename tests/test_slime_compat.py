"""A plugin file written for slime imports slime's types (`from slime.utils.types import Sample`,
`from slime.rollout.filter_hub.base_types import DynamicFilterOutput`); without slime installed
those imports are served by pipeline/slime/stand_ins.py, and an installed slime always wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")

# a reward and a dynamic filter as slime's docs write them: slime's imports, slime's signatures
SLIME_PLUGIN = textwrap.dedent('''
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    from slime.utils.types import Sample


    async def exact_answer(args, sample: Sample, **kwargs) -> float:
        assert isinstance(sample, Sample)
        return 1.0 if sample.label and sample.label in sample.response else 0.0


    def keep_mixed(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
        rewards = [s.get_reward_value(args) for s in samples]
        if len(set(rewards)) == 1:
            return DynamicFilterOutput(keep=False, reason="same_reward_{:.0f}".format(rewards[0]))
        return DynamicFilterOutput(keep=True)
''')


def python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = dict(ENV, PYTHONPATH=os.pathsep.join([*map(str, paths), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_slimes_type_modules_stand_in_and_nothing_else_does():
    proc = python('''
        from pipeline.slime import stand_ins
        assert not stand_ins.installed()
        assert stand_ins.install() and stand_ins.install() and stand_ins.installed()
        import pipeline
        from slime.utils.types import Sample
        from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
        assert Sample is pipeline.Sample and Sample.Status.COMPLETED is pipeline.Sample.Status.COMPLETED
        assert (RolloutFnTrainOutput, RolloutFnEvalOutput, DynamicFilterOutput) == (
            pipeline.RolloutFnTrainOutput, pipeline.RolloutFnEvalOutput, pipeline.DynamicFilterOutput)
        import slime.rollout
        assert "stand-in" in slime.rollout.__doc__
        try:
            from slime.rollout.rm_hub import async_rm
        except ModuleNotFoundError as exc:
            print("REFUSED", exc)
    ''')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED No module named 'slime.rollout.rm_hub': slime is not installed here" in proc.stdout
    assert "slime.utils.types" in proc.stdout and "pipeline/slime/stand_ins.py" in proc.stdout


def test_an_installed_slime_wins(tmp_path):
    real = tmp_path / "site" / "slime" / "utils"
    real.mkdir(parents=True)
    (tmp_path / "site" / "slime" / "__init__.py").write_text("")
    (real / "__init__.py").write_text("")
    (real / "types.py").write_text("class Sample:\n    REAL = True\n")
    proc = python('''
        from pipeline.slime import stand_ins
        assert not stand_ins.install() and not stand_ins.installed()
        from slime.utils.types import Sample
        assert Sample.REAL
        try:
            import slime.rollout.base_types
        except ModuleNotFoundError as exc:
            assert "stand" not in str(exc), exc  # the real package's own error, not ours
        else:
            raise AssertionError("the real slime has no rollout package")
    ''', tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.timeout(300)
def test_a_slime_plugin_file_with_slimes_imports_runs_unchanged(tmp_path):
    (tmp_path / "plug" / "mylab").mkdir(parents=True)
    (tmp_path / "plug" / "mylab" / "__init__.py").write_text("")
    (tmp_path / "plug" / "mylab" / "slime_rm.py").write_text(SLIME_PLUGIN)
    run_dir = tmp_path / "run"
    env = dict(ENV, PYTHONPATH=str(tmp_path / "plug"))
    args = ["experiment=smoke", "logger=jsonl", "num_rollout=2", "allowed_targets_extra=[mylab.]",
            "reward=custom", "reward.custom_rm_path=mylab.slime_rm.exact_answer",
            "dynamic_filter.path=mylab.slime_rm.keep_mixed", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    kept = 0
    for row in rows:
        # the plugin's reward reached the metrics, and its filter verdicts were counted under its reasons
        assert 0.0 <= row["rollout/raw_reward"] <= 1.0
        reasons = {k for k in row if k.startswith("rollout/dynamic_filter/drop_")}
        assert reasons <= {"rollout/dynamic_filter/drop_same_reward_0", "rollout/dynamic_filter/drop_same_reward_1"}
        kept += row["rollout/raw_reward"] not in (0.0, 1.0)
    assert kept  # mixed groups were kept


def test_a_missing_slime_module_says_what_to_put_on_the_path_and_install():
    """Without slime's source on the path, a `slime.` plugin beyond the type modules fails naming what
    running slime's own plugins takes (docs/slime.md, Porting from slime)."""
    proc = python('''
        from pipeline.config.plugins import PluginImportError, load_object
        try:
            load_object("slime.rollout.rm_hub.async_rm", ("pipeline.", "slime."), "reward function (custom_rm_path)")
        except PluginImportError as exc:
            print("REFUSED", exc)
    ''')
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("REFUSED reward function (custom_rm_path): cannot import 'slime.rollout.rm_hub.async_rm': "
                          "ModuleNotFoundError: No module named 'slime.rollout.rm_hub': slime is not installed here")
    assert "put slime's source on PYTHONPATH (PYTHONPATH=<your slime checkout> python run.py ...)" in out
    assert "pip install pylatexenc aiohttp" in out and "(docs/slime.md, Porting from slime)" in out


def test_a_missing_dependency_of_slime_s_source_is_named_with_the_line_that_imports_it(tmp_path):
    """slime's source on the path, a package its grader imports missing (pylatexenc, as at @624b824):
    the error names the package, the file and line importing it, and what slime's plugins need."""
    hub = tmp_path / "src" / "slime" / "rollout" / "rm_hub"
    hub.mkdir(parents=True)
    for pkg in (tmp_path / "src" / "slime", hub.parent):
        (pkg / "__init__.py").write_text("")
    (hub / "__init__.py").write_text("from .math_utils import grade\n\n\nasync def async_rm(args, sample, **kwargs):\n"
                                     "    return grade(sample.response, sample.label)\n")
    (hub / "math_utils.py").write_text("import re\nfrom no_such_latex_package_xyz import latex2text\n\n\n"
                                       "def grade(response, label):\n    return 1\n")
    proc = python('''
        from pipeline.config.plugins import PluginImportError, load_object
        try:
            load_object("slime.rollout.rm_hub.async_rm", ("slime.",), "reward function (custom_rm_path)")
        except PluginImportError as exc:
            print("REFUSED", exc)
    ''', tmp_path / "src")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "ModuleNotFoundError: No module named 'no_such_latex_package_xyz'" in out
    assert (f"{hub / 'math_utils.py'} line 2 imports 'no_such_latex_package_xyz', which is not installed in this "
            f"environment: pip install no_such_latex_package_xyz (or the distribution that provides it)") in out
    assert ("slime's own plugins need slime's source on PYTHONPATH (PYTHONPATH=<your slime checkout> python run.py "
            "...), allowed_targets_extra=[slime.] and pip install pylatexenc aiohttp (docs/slime.md, Porting from slime)") in out
