"""End to end through the CLI in a subprocess: run dirs, offline wandb vs metrics.jsonl, multirun
with a sweep summary, resume equivalence, slime plugins by dotted path, --help / --cfg job."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline.data.checkpoint import read_checkpoint
from pipeline.engines.scripted import ByteTokenizer
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import read_metrics

from tests.sinks import wandb_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli_data")
    rows = [{"input": f"What is {i} + {2 * i + 3}?", "label": str(3 * i + 3)} for i in range(40)]
    path = d / "arith.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base(data: Path, engine_rollout: bool = True) -> list[str]:
    quiet = ["rollout.progress=false", "rollout.summary=false"] if engine_rollout else []
    return ["engine=scripted", f"data_source.prompt_data={data}", "rollout_batch_size=2", "n_samples_per_prompt=2",
            "rollout_max_response_len=256"] + quiet


def run_cli(args: list[str], timeout: int = 240, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", RAY_AUTH_MODE="disabled",
                    HYDRA_FULL_ERROR="1", **env)
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"run.py {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def wandb_files(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "wandb").glob("offline-run-*/run-*.wandb") if not p.parent.is_symlink())


def check_run_dir(run_dir: Path, steps: list[int]) -> list[dict]:
    """metrics.jsonl, train data, sample dumps, checkpoint and an offline wandb run that matches."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == steps
    for r in rows:
        for key in ("rollout/raw_reward", "rollout/response_len/mean", "rollout/truncated_ratio",
                    "perf/rollout_time", "perf/tokens_per_sec", "perf/stage/generate_time"):
            assert key in r, (key, sorted(r))
    for step in steps:
        td = pipeline.load_train_data(run_dir / "train_data" / f"rollout_{step}")
        dumped = read_samples(run_dir / "samples" / f"rollout_{step}.jsonl")
        assert td["sample_indices"] == [s.index for s in dumped]
        assert len(td["tokens"]) == len(td["loss_masks"]) == len(dumped) > 0
    assert (run_dir / "checkpoints" / f"rollout_{steps[-1]}.json").exists()
    logged = {}
    files = wandb_files(run_dir)
    assert files, f"no offline wandb run in {run_dir}"
    for f in files:
        for h in wandb_records.history(f):
            logged[h["_step"]] = h
    assert sorted(logged) == steps
    for r in rows:
        got = logged[r["step"]]
        for key, value in r.items():
            if key == "step" or value is None:
                continue
            assert key in got, f"{key} not in the wandb row of step {r['step']}"
            assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), (key, got[key], value)
    return rows


@pytest.mark.timeout(300)
def test_buffered_reward_topk_run(data, tmp_path):
    run_dir = tmp_path / "run"
    run_cli(base(data) + ["data_source=buffered", "filter=reward_topk", "num_rollout=3", f"hydra.run.dir={run_dir}"])
    check_run_dir(run_dir, [0, 1, 2])
    info = wandb_records.run_info(wandb_files(run_dir)[0])
    # a single run is named after its run dir plus its overrides (not just "run")
    assert info["group"] == "" and info["name"].startswith("run ") and "filter=reward_topk" in info["name"]
    assert info["config"]["data_source"]["_target_"] == "pipeline.data.sources.BufferedDataSource"
    assert info["config"]["rollout_batch_size"] == 2
    state = read_checkpoint(run_dir / "checkpoints" / "rollout_2.json")
    assert state["rollout_id"] == 2 and "buffer" in state


@pytest.mark.timeout(600)
def test_multirun_six_jobs_with_summary(data, tmp_path):
    sweep = tmp_path / "sweep"
    run_cli(["-m", "data_source.seed=1,2,3", "n_samples_per_prompt=4,8", "num_rollout=2", "rollout_batch_size=1",
             f"hydra.sweep.dir={sweep}"] + [a for a in base(data) if not a.startswith(("n_samples", "rollout_batch"))],
            timeout=580)
    jobs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: int(p.name))
    assert [p.name for p in jobs] == ["0", "1", "2", "3", "4", "5"]
    ids, combos = set(), set()
    for job in jobs:
        check_run_dir(job, [0, 1])
        info = wandb_records.run_info(wandb_files(job)[0])
        assert info["group"] == sweep.name
        ids.add(info["id"])
        combos.add((info["config"]["data_source"]["seed"], info["config"]["n_samples_per_prompt"]))
        n = info["config"]["n_samples_per_prompt"]
        assert len(read_samples(job / "samples" / "rollout_0.jsonl")) == n
    assert len(ids) == 6 and combos == {(s, n) for s in (1, 2, 3) for n in (4, 8)}
    summary = (sweep / "summary.md").read_text()
    table = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| job")]
    assert len(table) == 6 and "data_source.seed=1 n_samples_per_prompt=4" in summary
    final = {r["job"]: r["metrics"]["rollout/raw_reward"] for r in json.loads((sweep / "summary.json").read_text())}
    assert final["3"] == read_metrics(jobs[3] / "metrics.jsonl")[-1]["rollout/raw_reward"]


@pytest.mark.timeout(400)
def test_resume_hands_out_the_same_samples(data, tmp_path):
    common = base(data) + ["data_source=buffered", "rollout.deterministic=true", "logger=wandb"]
    full, part = tmp_path / "full", tmp_path / "part"
    run_cli(common + ["num_rollout=4", f"hydra.run.dir={full}"])
    run_cli(common + ["num_rollout=2", f"hydra.run.dir={part}"])
    run_cli(common + ["num_rollout=4", f"resume={part}", f"hydra.run.dir={tmp_path / 'resume_record'}"])

    def key(run_dir, r):
        return [(s.prompt, s.group_index, s.index) for s in read_samples(run_dir / "samples" / f"rollout_{r}.jsonl")]

    for r in range(4):
        assert key(full, r) == key(part, r), f"rollout {r} differs after resume"
    check_run_dir(part, [0, 1, 2, 3])  # same metrics.jsonl, continued
    run_ids = {wandb_records.run_info(f)["id"] for f in wandb_files(part)}
    assert len(wandb_files(part)) == 2 and len(run_ids) == 1  # the same wandb run, resumed


@pytest.mark.timeout(300)
def test_slime_plugins_by_dotted_path(data, tmp_path):
    p = "tests.plugins.slime_plugins."
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    run_cli(base(data, engine_rollout=False) + [
        "allowed_targets_extra=[tests.]", "logger=jsonl", "data_source=buffered", "num_rollout=3",
        "over_sampling_batch_size=4", "rollout=function", f"rollout.path={p}generate_rollout",
        f"filter.path={p}lifo_buffer_filter", f"dynamic_filter.path={p}drop_first_group_filter",
        f"custom_reward_post_process_path={p}double_reward_post_process",
        f"rollout_sample_filter_path={p}remove_wrong_sample_filter",
        f"custom_rollout_log_function_path={p}rollout_log",
        "eval=function", f"eval.path={p}generate_rollout", "eval_interval=2", f"hydra.run.dir={run_dir}",
    ], SLIME_PLUGIN_LOG_DIR=str(logs))
    groups = {r: sorted({s.group_index for s in read_samples(run_dir / "samples" / f"rollout_{r}.jsonl")})
              for r in range(3)}
    assert groups == {0: [1, 2], 1: [3, 4], 2: [5, 6]}  # group 0 dropped; surplus served from the buffer
    served = {s.group_index: s.metadata.get("served_from_buffer_at")
              for r in range(3) for s in read_samples(run_dir / "samples" / f"rollout_{r}.jsonl")}
    assert served == {1: None, 2: None, 3: 1, 4: None, 5: 2, 6: 2}  # the real rollout_id reached the filter
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[0]["rollout/slime_plugin_dropped"] == 1
    assert "eval/toy" in rows[1] and "eval/toy" not in rows[0]
    for r in range(3):
        td = pipeline.load_train_data(run_dir / "train_data" / f"rollout_{r}")
        raw = td["raw_reward"]
        for i in range(0, len(raw), 2):
            mean = (raw[i] + raw[i + 1]) / 2
            assert td["rewards"][i:i + 2] == [2 * (raw[i] - mean), 2 * (raw[i + 1] - mean)]
        for rr, mask in zip(raw, td["loss_masks"]):
            assert (sum(mask) == 0) == (rr == 0)
        assert json.loads((logs / f"log_{r}.json").read_text())["n"] == 4

    run2 = tmp_path / "run2"
    run_cli(base(data, engine_rollout=False) + ["allowed_targets_extra=[tests.]", "logger=jsonl", "num_rollout=1",
                                                "rollout=function",
                          f"rollout.path={p}generate_rollout",
                          f"custom_convert_samples_to_train_data_path={p}convert_samples", f"hydra.run.dir={run2}"])
    td = pipeline.load_train_data(run2 / "train_data" / "rollout_0")
    assert td["converted_by"] == "slime_plugins" and set(td) == {
        "tokens", "response_lengths", "rewards", "sample_indices", "loss_masks", "converted_by"}


@pytest.mark.timeout(240)
def test_a_plus_key_one_typo_from_a_known_key_is_warned_at_the_top_of_the_run_log(data, tmp_path):
    """Hydra refuses `n_sample_per_prompt=4` and suggests `+n_sample_per_prompt=4`, which then ran at
    the default silently; a key of one's own plugin, far from every known key, stays quiet."""
    run_dir = tmp_path / "run"
    proc = run_cli(base(data) + ["logger=jsonl", "num_rollout=1", "+n_sample_per_prompt=4", "+my_plugin_knob=3",
                                 f"hydra.run.dir={run_dir}"])
    hint = "did you mean n_samples_per_prompt?"
    console = proc.stdout + proc.stderr
    assert hint in console and "my_plugin_knob" not in console
    head = (run_dir / "run.log").read_text().splitlines()[:3]
    assert any(hint in line and "+n_sample_per_prompt=4" in line for line in head), head


@pytest.mark.timeout(120)
def test_help_lists_groups_and_cfg_job_prints_config(data):
    out = run_cli(["--help"]).stdout
    for group, options in {"data_source": "buffered, plain", "filter": "oldest_first, pop_first, reward_topk",
                           "advantage": "cispo", "logger": "jsonl, wandb"}.items():
        line = next(x for x in out.splitlines() if x.strip().startswith(f"{group}:"))
        assert all(o in line for o in options.split(", ")), line
    cfg = run_cli(["--cfg", "job", "--resolve", f"data_source.prompt_data={data}", "rollout_batch_size=3",
                   "paths.output_dir=/tmp/x"]).stdout
    assert "rollout_batch_size: 3" in cfg and "over_sampling_batch_size: 3" in cfg
    assert "_target_: pipeline.data.sources.PlainDataSource" in cfg


# run.py as `python run.py ARGS` runs it, reporting at exit whether torch was ever imported
_IMPORTS_TORCH = ("import atexit, runpy, sys; "
                  "atexit.register(lambda: sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}\\n')); "
                  "sys.argv = ['run.py', *sys.argv[1:]]; runpy.run_path('run.py', run_name='__main__')")


@pytest.mark.parametrize("args, code", [(["--help"], 0), (["--cfg", "job"], 0), (["rollout_batch_size=-1"], 1)],
                         ids=["help", "cfg-job", "refused-at-pre-flight"])
def test_commands_that_run_nothing_do_not_import_torch(args, code):
    """--help, --cfg job and a command refused at pre-flight answer in about a second: torch
    (about 3 s to import) is imported only for a run that passed pre-flight."""
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_TORCH, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, HYDRA_FULL_ERROR="1"))
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "torch imported: False" in proc.stderr, proc.stderr[-3000:]
    if code:
        assert "rollout_batch_size: expected a positive integer, got -1" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_through_the_hydra_ray_launcher(data, tmp_path):
    """hydra-ray-launcher (local Ray) runs each job as a Ray task; same run dirs and summary."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "raysweep"
    run_cli(["-m", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", "data_source.seed=1,2",
             "num_rollout=2", "logger=jsonl", f"hydra.sweep.dir={sweep}"] + base(data), timeout=280)
    for job in ("0", "1"):
        rows = read_metrics(sweep / job / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1]
        assert (sweep / job / "checkpoints" / "rollout_1.json").exists()
    assert len([x for x in (sweep / "summary.md").read_text().splitlines() if x.startswith("| ") and "job" not in x]) == 2


@pytest.mark.timeout(120)
def test_smoke_experiment_on_the_bundled_prompts(tmp_path):
    run_dir = tmp_path / "smoke"
    run_cli(["experiment=smoke", "rollout.progress=false", f"hydra.run.dir={run_dir}"])
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    prompts = [s.prompt for s in read_samples(run_dir / "samples" / "rollout_0.jsonl")]
    tok = ByteTokenizer()  # the scripted engine's tokenizer renders the chat template
    bundled = {tok.apply_chat_template([{"role": "user", "content": json.loads(x)["input"]}], add_generation_prompt=True)
               for x in (ROOT / "data" / "math_train.jsonl").read_text().splitlines()}
    assert prompts and set(prompts) <= bundled


@pytest.mark.timeout(120)
def test_sft_experiment_masks_assistant_turns(tmp_path):
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6!"}]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": conv}) + "\n" for _ in range(6)))
    run_dir = tmp_path / "sft"
    run_cli(["experiment=sft", "engine=scripted", "logger=jsonl", f"data_source.prompt_data={chat}", "num_rollout=2",
             "rollout_batch_size=3", f"hydra.run.dir={run_dir}"])
    td = pipeline.load_train_data(run_dir / "train_data" / "rollout_1")
    assert len(td["tokens"]) == 3 and td["rewards"] == [0, 0, 0]
    for tokens, n, mask in zip(td["tokens"], td["response_lengths"], td["loss_masks"]):
        trained = "".join(chr(t) for t, m in zip(tokens[-n:], mask) if m)
        assert trained == "46!"
