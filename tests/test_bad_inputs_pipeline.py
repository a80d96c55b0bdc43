"""Bad inputs across config, data, plugins and checkpoints, through the app (`pipeline.run.app.run`
on a composed config) or the CLI (`python run.py ...`). Each case is a row of the table in docs/reliability.md
"Bad inputs and the errors they give" (the cross-layer one): the test checks that the message
quoted there is part of the real one, and that every case has its row.

The plugins the cases point at live in this module (`tests.test_bad_inputs_pipeline.<name>`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hydra import compose, initialize_config_dir

from pipeline.run.app import run
from pipeline.samples.sample import Sample

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ME = "tests.test_bad_inputs_pipeline"
TABLE_START = "<!-- cross-layer bad inputs: tests/test_bad_inputs_pipeline.py -->"


# ------------------------------------------------------------------------------- plugins
def _filled(data_source: Any, args: Any) -> list[list[Sample]]:
    """rollout_batch_size groups from the source, each sample answered with reward 1.0."""
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for s in group:
            s.response, s.tokens, s.response_length = "ok", [1, 2, 3, 4], 2
            s.reward, s.status = 1.0, Sample.Status.COMPLETED
    return groups


def good_rollout(args, rollout_id, data_source, evaluation=False):
    return _filled(data_source, args)


def rollout_none(args, rollout_id, data_source, evaluation=False):
    _filled(data_source, args)
    return None


def rollout_ints(args, rollout_id, data_source, evaluation=False):
    return [[1, 2] for _ in _filled(data_source, args)]


def rollout_dicts(args, rollout_id, data_source, evaluation=False):
    return [[s.to_dict() for s in g] for g in _filled(data_source, args)]


def rollout_short_group(args, rollout_id, data_source, evaluation=False):
    return [g[:1] for g in _filled(data_source, args)]


def rollout_fanout_ids(args, rollout_id, data_source, evaluation=False):
    groups = _filled(data_source, args)
    for g in groups:
        g[0].rollout_id, g[1].rollout_id = 0, 1
    return [[g] for g in groups]  # each group fans out into one list of siblings


def _with_reward(reward: Any) -> Callable[..., Any]:
    def rollout(args, rollout_id, data_source, evaluation=False):
        groups = _filled(data_source, args)
        groups[0][1].reward = reward
        return groups
    return rollout


rollout_nan = _with_reward(float("nan"))
rollout_str_reward = _with_reward("1.0")


def rollout_dict_reward(args, rollout_id, data_source, evaluation=False):
    groups = _filled(data_source, args)
    for g in groups:
        for s in g:
            s.reward = {"acc": 1.0}
    return groups


def rollout_bad_mask(args, rollout_id, data_source, evaluation=False):
    groups = _filled(data_source, args)
    groups[0][0].loss_mask = [1, 1, 1]
    return groups


def rollout_one_arg(args):
    raise AssertionError("never called: the signature is checked at build time")


def filter_two_args(args, buffer):
    raise AssertionError("never called: the signature is checked at build time")


def log_two_args(rollout_id, args):
    raise AssertionError("never called: the signature is checked at build time")


def reward_one_arg(sample):
    raise AssertionError("never called: the signature is checked when it is loaded")


def rollout_reads_loss_mask_type(args, rollout_id, data_source, evaluation=False):
    """A slime plugin reading a slime arg this config does not define."""
    assert args.loss_mask_type
    return _filled(data_source, args)


def sample_hook_returns_dict(args, sample):
    return {"index": sample.index}


async def reward_dict(args, sample):
    return {"acc": float(sample.index % 2)}


# ------------------------------------------------------------------------------- helpers
def _data(tmp: Path, rows: int = 8) -> Path:
    path = tmp / "d.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n"
                                for i in range(rows)))
    return path


def _overrides(tmp: Path, *extra: str) -> list[str]:
    rollout = [] if any(x.startswith("rollout=") for x in extra) else [
        "rollout=function", f"rollout.path={ME}.good_rollout"]
    return [f"paths.output_dir={tmp}/run", f"data_source.prompt_data={_data(tmp)}", "data_source.apply_chat_template=false",
            "rollout_batch_size=2", "n_samples_per_prompt=2", "num_rollout=1", "allowed_targets_extra=[tests.]",
            "engine=scripted", *rollout, "logger=jsonl", *extra]


def _app(tmp: Path, *extra: str) -> str:
    """Run the app in-process; the error as `Type: message` (fails when nothing is raised)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=_overrides(tmp, *extra))
    with pytest.raises(Exception) as err:
        run(cfg)
    return f"{type(err.value).__name__}: {err.value}"


def _compose(tmp: Path, *extra: str) -> str:
    """Composition itself fails (Hydra's own errors)."""
    with pytest.raises(Exception) as err, initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        compose(config_name="config", overrides=_overrides(tmp, *extra))
    return f"{type(err.value).__name__}: {err.value}"


def _cli(tmp: Path, *extra: str) -> str:
    """`python run.py ...` in a subprocess; must exit non-zero; returns its stderr + stdout."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "run.py", *_overrides(tmp, *extra), f"hydra.run.dir={tmp}/run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (tmp / "run" / "metrics.jsonl").exists(), "the run started despite the bad input"
    return proc.stderr + proc.stdout


def _sweep_into_one_dir(tmp: Path) -> str:
    """A sweep with one plain paths.output_dir: refused before Hydra writes anything."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "run.py", "-m", *_overrides(tmp, "data_source.seed=1,2"),
                           f"paths.output_dir={tmp}/out", f"hydra.sweep.dir={tmp}/sweep"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (tmp / "out").exists() and not (tmp / "sweep").exists(), "the refused sweep wrote files"
    return proc.stderr + proc.stdout


def _resume_after(tmp: Path, damage: Callable[[Path], None], *extra: str) -> str:
    """One good rollout (checkpoint rollout_0), `damage` the checkpoints folder, resume."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run(compose(config_name="config", overrides=_overrides(tmp)))
    damage(tmp / "run" / "checkpoints")
    return _app(tmp, f"resume={tmp}/run", "num_rollout=2", *extra)


def _truncate(ck: Path) -> None:
    f = ck / "rollout_0.json"
    f.write_bytes(f.read_bytes()[:-5])


def _empty_data(tmp: Path) -> str:
    (tmp / "d.jsonl").write_text("")
    return _app(tmp)


def _all_rows_bad(tmp: Path) -> str:
    (tmp / "d.jsonl").write_text('{"question": "a"}\n{"question": "b"}\n')
    return _app(tmp, "data_source.skip_bad_rows=true")


def _non_utf8(tmp: Path) -> str:
    (tmp / "d.jsonl").write_bytes(b'{"input": "a", "label": "1"}\n{"input": "\xff\xfe b", "label": "2"}\n')
    return _app(tmp)


def _unknown_rm_type(tmp: Path) -> str:
    rows = [{"input": "What is 1 + 1?", "label": "2", "metadata": {"rm_type": t}} for t in ("math", "gsm8k")]
    (tmp / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return _app(tmp, "rollout=engine")


def _rows(tmp: Path, rows: list[dict[str, Any]], *extra: str) -> str:
    """The app on a data file of `rows` (what `_data` would write is replaced)."""
    _data(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return _app(tmp, *extra)


def _no_checkpoints(tmp: Path) -> str:
    (tmp / "empty").mkdir()
    return _app(tmp, f"resume={tmp}/empty")


def _sweep_dir(tmp: Path) -> str:
    for job in ("0", "1"):
        (tmp / "sweep" / job / ".hydra").mkdir(parents=True)
        (tmp / "sweep" / job / ".hydra" / "overrides.yaml").write_text(f"- data_source.seed={job}\n")
    return _app(tmp, f"resume={tmp}/sweep")


def _read_only(tmp: Path) -> str:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    with patch("tempfile.TemporaryFile", refuse):
        return _resume_after(tmp, lambda ck: None)


def _in_use(tmp: Path) -> str:
    """Another process's lock on the run dir (an flock on a second open file, as a live run holds)."""
    (tmp / "run").mkdir()
    fd = os.open(tmp / "run" / "run.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": 4242, "host": "node7", "started": "10:00", "argv": "run.py"}).encode())
        return _app(tmp)
    finally:
        os.close(fd)


def _run_dir_holds_a_run(tmp: Path) -> str:
    """A second fresh run (no resume=) into the dir of a finished one."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run(compose(config_name="config", overrides=_overrides(tmp)))
    before = (tmp / "run" / "metrics.jsonl").read_bytes()
    message = _app(tmp, "num_rollout=2")
    assert (tmp / "run" / "metrics.jsonl").read_bytes() == before, "the refused run touched the first run's metrics"
    return message


CASES: dict[str, Callable[[Path], str]] = {
    # config, through the CLI
    "unknown-option": lambda t: _cli(t, "rollout_batchsize=2"),
    "wrong-type": lambda t: _cli(t, "rollout_batch_size=abc"),
    "dataset-missing": lambda t: _cli(t, "data_source.prompt_data=nope.jsonl"),
    "target-not-allowed-cli": lambda t: _cli(t, "rollout.path=os.system"),
    "sweep-into-one-dir": _sweep_into_one_dir,
    # config, in-process
    "unknown-group-option": lambda t: _compose(t, "engine=nope"),
    "zero-size": lambda t: _app(t, "rollout_batch_size=0"),
    "negative-size": lambda t: _app(t, "n_samples_per_prompt=-2"),
    "not-a-bool": lambda t: _app(t, "partial_rollout=maybe"),
    "over-sampling-too-small": lambda t: _app(t, "over_sampling_batch_size=1"),
    "filter-needs-buffer": lambda t: _app(t, "filter=reward_topk"),
    # data, through the app
    "dataset-empty": _empty_data,
    "all-rows-filtered": _all_rows_bad,
    "non-utf8-bytes": _non_utf8,
    "unknown-rm-type": _unknown_rm_type,
    # plugins
    "plugin-does-not-import": lambda t: _app(t, "rollout.path=tests.no_such_module.generate"),
    "reward-fn-does-not-import": lambda t: _app(t, "rollout=engine", "reward=custom",
                                                "reward.custom_rm_path=myplug.reward", "allowed_targets_extra=[myplug.]"),
    "plugin-no-such-function": lambda t: _app(t, f"rollout.path={ME}.no_such_function"),
    "filter-wrong-signature": lambda t: _app(t, "data_source=buffered", f"filter.path={ME}.filter_two_args"),
    "rollout-wrong-signature": lambda t: _app(t, f"rollout.path={ME}.rollout_one_arg"),
    "hook-wrong-signature": lambda t: _app(t, f"custom_rollout_log_function_path={ME}.log_two_args"),
    "reward-fn-wrong-signature": lambda t: _app(t, "rollout=engine", "reward=custom",
                                                f"reward.custom_rm_path={ME}.reward_one_arg"),
    "custom-generate-not-allowed": lambda t: _app(t, "rollout=engine", "rollout.custom_generate_path=os.system"),
    "unset-slime-arg": lambda t: _app(t, f"rollout.path={ME}.rollout_reads_loss_mask_type"),
    "sample-hook-bad-return": lambda t: _app(t, "rollout=engine", "rollout.progress=false",
                                             f"rollout_sample_hook_path=[{ME}.sample_hook_returns_dict]"),
    "rollout-returns-none": lambda t: _app(t, f"rollout.path={ME}.rollout_none"),
    "rollout-wrong-nesting": lambda t: _app(t, f"rollout.path={ME}.rollout_ints"),
    "rollout-wrong-group-size": lambda t: _app(t, f"rollout.path={ME}.rollout_short_group"),
    "rollout-non-sample-items": lambda t: _app(t, f"rollout.path={ME}.rollout_dicts"),
    "fanout-rollout-ids-differ": lambda t: _app(t, f"rollout.path={ME}.rollout_fanout_ids"),
    "nan-reward": lambda t: _app(t, f"rollout.path={ME}.rollout_nan"),
    "non-numeric-reward": lambda t: _app(t, f"rollout.path={ME}.rollout_str_reward"),
    "dict-reward-no-reward-key": lambda t: _app(t, f"rollout.path={ME}.rollout_dict_reward"),
    "dict-reward-missing-key": lambda t: _app(t, f"rollout.path={ME}.rollout_dict_reward", "reward_key=score"),
    "dict-reward-dynamic-filter": lambda t: _app(t, "rollout=engine", "dynamic_filter=nonzero_std", "reward=custom",
                                                 f"reward.custom_rm_path={ME}.reward_dict"),
    "empty-prompt": lambda t: _rows(t, [{"input": "What is 1 + 1?", "label": "2"}, {"input": "", "label": "3"}]),
    "dict-label": lambda t: _rows(t, [{"input": f"What is {i} + 1?", "label": {"answer": i + 1, "points": 3}}
                                      for i in range(8)], "rollout=engine"),
    "loss-mask-length": lambda t: _app(t, f"rollout.path={ME}.rollout_bad_mask"),
    # checkpoints and resume
    "resume-not-a-dir": lambda t: _app(t, f"resume={t}/nope"),
    "resume-no-checkpoints": _no_checkpoints,
    "resume-truncated-checkpoint": lambda t: _resume_after(t, _truncate),
    "resume-different-data": lambda t: _resume_after(t, lambda ck: None, "data_source.seed=7",
                                                     "allow_config_change=true"),
    "resume-changed-config": lambda t: _resume_after(t, lambda ck: None, "advantage=rloo"),
    "resume-sweep-dir": _sweep_dir,
    "resume-read-only": _read_only,
    "run-dir-in-use": _in_use,
    "run-dir-holds-a-run": _run_dir_holds_a_run,
}


def readme_rows() -> dict[str, str]:
    """case id -> the error quoted in the cross-layer table of docs/reliability.md."""
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert TABLE_START in text, f"docs/reliability.md lacks the marker {TABLE_START}"
    table = text.split(TABLE_START, 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"\| `([\w-]+)` \| .* \| `(.*)` \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_case_has_a_readme_row_and_back():
    assert sorted(readme_rows()) == sorted(CASES)
    assert len(CASES) + 23 >= 25


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_the_documented_message(case: str, tmp_path: Path) -> None:
    message = CASES[case](tmp_path)
    rel = message.replace(str(tmp_path) + "/", "").replace(str(ROOT) + "/", "")
    for part in readme_rows()[case].split("..."):
        assert part.strip() in rel, f"{case}: {part.strip()!r} not in\n{rel}"


@pytest.mark.timeout(60)
def test_plugin_signatures_are_checked_before_anything_runs(tmp_path: Path) -> None:
    """A wrong filter signature stops the run at build time: no rollout, no metrics, no checkpoint."""
    _app(tmp_path, "data_source=buffered", f"filter.path={ME}.filter_two_args")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


@pytest.mark.timeout(60)
def test_truncated_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path, caplog) -> None:
    """With an older valid checkpoint, resume skips the truncated newest one and says so."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run(compose(config_name="config", overrides=_overrides(tmp_path, "num_rollout=2")))
        f = tmp_path / "run" / "checkpoints" / "rollout_1.json"
        f.write_bytes(f.read_bytes()[:-5])
        with caplog.at_level(logging.WARNING):
            run(compose(config_name="config", overrides=_overrides(tmp_path, f"resume={tmp_path}/run",
                                                                   "num_rollout=2")))
    assert "rollout_1.json" in caplog.text and "truncated" in caplog.text
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
