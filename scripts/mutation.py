"""Mutation testing of the modules that carry the pipeline's promises (mutmut; not in CI: slow).

    python scripts/mutation.py                                  # every covered module
    python scripts/mutation.py pipeline/data/order.py ...       # some of them
    python scripts/mutation.py --rerun-survivors MODULE         # only the last run's survivors, current tests
    python scripts/mutation.py --resume MODULE                  # what a run stopped at the time limit left
    python scripts/mutation.py --report-only                    # the report of the last runs again
    python scripts/mutation.py --list                           # the module -> tests map

Each module runs on its own, against only the fast unit tests that pin it (`MODULES`), in a
scratch copy of the repo under `.mutation/<module>/` (mutmut writes its mutated tree there;
the working tree is never touched). One worker, one torch thread. The report
(killed / survived / timeout per module, each survivor with its diff) goes to stdout and to
`.mutation/report.md`. docs/mutation.md explains how to read it; scripts/mutation_equivalents.py
lists the survivors that no test can kill, with the reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_equivalents import EQUIVALENT  # noqa: E402

logger = logging.getLogger("mutation")

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"

# module -> (the fast tests that pin it, mutant-name globs to restrict to some functions or None)
MODULES: dict[str, tuple[list[str], list[str] | None]] = {
    "pipeline/data/order.py": (["tests/data/test_order.py", "tests/data/test_epoch_cursor.py",
                                "tests/data/test_epoch_order_cache.py"], None),
    # the cursor, fresh groups, the buffer and its state (not construction or gauges)
    "pipeline/data/sources.py": (["tests/data/test_sources.py", "tests/data/test_epoch_cursor.py",
                                  "tests/data/test_source_groups.py", "tests/data/test_buffer_filter_order.py",
                                  "tests/data/test_checkpoint.py", "tests/data/test_slime_driver.py"],
                                 [f"pipeline.data.sources.x*{fn}__mutmut_*" for fn in (
                                     "_copies", "_next_rows", "_groups", "_check_num", "get_samples", "add_samples",
                                     "begin_rollout", "get_buffer_length", "state_dict", "_state",
                                     "_check_removed")]),
    "pipeline/data/buffer_filters.py": (["tests/data/test_buffer_filter_order.py", "tests/data/test_sources.py"],
                                        None),
    # (test_checkpoint_crash.py kills a real subprocess: too slow to run per mutant)
    "pipeline/data/checkpoint.py": (["tests/data/test_checkpoint.py", "tests/data/test_checkpoint_format.py"], None),
    "pipeline/process/atomic.py": (["tests/test_atomic.py", "tests/data/test_checkpoint.py"], None),
    "pipeline/process/openmp.py": (["tests/test_openmp.py"], None),
    "pipeline/process/malloc.py": (["tests/test_malloc.py"], None),
    "pipeline/process/threads.py": (["tests/test_threads.py"], None),
    "pipeline/process/stop_signals.py": (["tests/test_stop_signals.py"], None),
    # the clean-up checks (not acquire / release: they start or join a real Ray; the engine and
    # trainer tests run them)
    "pipeline/cluster/ray_runtime.py": (["tests/test_ray_runtime.py"],
                                        [f"pipeline.cluster.ray_runtime.x_{fn}__mutmut_*"
                                         for fn in ("shuts_down_with", "gcs_reachable")]),
    # the empty-label rule and its pre-flight scan; the graders and the remote answer types (issue 31)
    "pipeline/rewards/labels.py": (["tests/rewards/test_empty_labels.py", "tests/rewards/test_slime_parity_graders.py",
                                    "tests/rewards/test_reward_preflight.py"], None),
    "pipeline/rewards/text_rules.py": (["tests/rewards/test_rule_graders.py",
                                        "tests/rewards/test_slime_parity_graders.py"], None),
    "pipeline/rewards/math.py": (["tests/rewards/test_math.py", "tests/rewards/test_slime_parity_graders.py"], None),
    "pipeline/rewards/remote.py": (["tests/rewards/test_dispatch.py", "tests/rewards/test_slime_parity_graders.py"],
                                   None),
    "pipeline/stages/rewards.py": (["tests/stages/test_stages.py",
                                    "tests/stages/test_rewards_pinned.py"], None),
    "pipeline/stages/train_data.py": (["tests/stages/test_stages.py", "tests/stages/test_train_data_tensors.py",
                                       "tests/stages/test_train_data_slime.py"], None),
    "pipeline/stages/log.py": (["tests/stages/test_stages.py",
                                "tests/stages/test_log_metrics_asymmetric.py"], None),
    "pipeline/rollout/dynamic_filters.py": (["tests/rollout/test_nonzero_std_filter.py"], None),
    # seeds, partial-rollout continuation and reset (not the custom-generate plugin loading)
    "pipeline/rollout/sample_generate.py": (["tests/rollout/test_deterministic_seeds.py",
                                             "tests/rollout/test_engine_rollout.py",
                                             "tests/rollout/test_sample_generate.py"],
                                            [f"pipeline.rollout.sample_generate.x_{fn}__mutmut_*" for fn in (
                                                "is_finished", "sampling_params_from_args", "to_engine_params",
                                                "sample_seed", "continuation_seed", "reset_sample",
                                                "default_generate")]),
    # the over-sampling loop, the keep/drop decision, the per-sample seeds and each item's hooks, custom
    # generate, reward and token count (not construction, the group-mode reward, the metrics or staleness)
    "pipeline/rollout/train_run.py": (["tests/rollout/test_engine_rollout.py",
                                       "tests/rollout/test_deterministic_seeds.py",
                                       "tests/rollout/test_plugins_and_adaptive.py",
                                       "tests/rollout/test_train_run_items.py"],
                                      [f"pipeline.rollout.train_run.xǁTrainRunǁ{fn}__mutmut_*" for fn in (
                                          "_full", "_top_up", "_decide_ready", "_decide", "_run_item")]),
    # what happens to the groups not admitted: finish, carry, restart, drop (all of it)
    "pipeline/rollout/leftover_groups.py": (["tests/rollout/test_leftover_groups.py",
                                             "tests/rollout/test_engine_rollout.py",
                                             "tests/rollout/test_deterministic_seeds.py"], None),
    # the trainer's loss functions (PPO-clip, CISPO, GSPO KL, KL estimators, TIS, IcePop, OPSM, reducers)
    "pipeline/train/losses.py": (["tests/train/test_train_losses.py"], None),
    # one micro-batch's loss and metrics (the order of slime's policy_loss_function)
    "pipeline/train/objective.py": (["tests/train/test_objective.py", "tests/train/test_policy_gradient.py"], None),
    # samples from train data, optimizer steps (by rollout), per-rollout weights, micro-batches, padding, log-probs
    "pipeline/train/batches.py": (["tests/train/test_batches.py", "tests/train/test_policy_gradient.py",
                                   "tests/train/test_shared_prompt.py"], None),
    # one prompt forward per group, responses in passes of similar length (equal to the per-sample pass)
    "pipeline/train/shared_prompt.py": (["tests/train/test_shared_prompt.py", "tests/train/test_batches.py"], None),
    # chunked log-probs and entropies with their gradient (equal to log-softmax + gather)
    "pipeline/train/token_log_probs.py": (["tests/train/test_token_log_probs.py", "tests/train/test_batches.py",
                                           "tests/train/test_shared_prompt.py"], None),
    # the trainer's loop on any process group: old log-probs, advantages, optimizer steps, micro-batches
    # (padded to the peers' count), the loss, weights and state
    # (not test_distributed_fast.py: its ~50 trainer tests would make each mutant cost a minute)
    "pipeline/train/policy_gradient.py": (["tests/train/test_policy_gradient.py",
                                           "tests/train/test_policy_gradient_parallel.py",
                                           "tests/train/test_train_sync.py"], None),
    # what the trainer fixes before its updates (advantages, a custom advantage hook) and the
    # micro-batches cut from it: real, empty (a worker's padding), slime's custom loss
    "pipeline/train/prepared.py": (["tests/train/test_prepared.py", "tests/train/test_policy_gradient.py",
                                    "tests/train/test_policy_gradient_parallel.py"], None),
    # the report's constant series and merged panels (the drawing itself is pinned by tests/test_report.py)
    "pipeline/report/shape.py": (["tests/test_report_shape.py"], None),
    # the disk estimate and the pruning of trainer states (trainer.keep_states)
    "pipeline/train/disk.py": (["tests/train/test_disk.py"], None),
    # the trainer state folder: safetensors + JSON, atomically; counters, optimizer, random streams
    # (not test_distributed_fast.py: its worker tests, which read these states too, would make each
    # mutant of seed_rngs, called by every trainer, cost minutes)
    "pipeline/train/state.py": (["tests/train/test_state.py", "tests/train/test_policy_gradient.py"], None),
    # AdamW and the warm-up / decay schedule
    "pipeline/train/optim.py": (["tests/train/test_optim.py", "tests/train/test_policy_gradient.py"], None),
    # the trainer's pre-flight refusals and warnings (workers, devices, strategies, splits, async)
    "pipeline/train/preflight.py": (["tests/train/test_trainer_preflight_keys.py",
                                     "tests/train/test_trainer_preflight_distributed.py",
                                     "tests/train/test_trainer_preflight_async.py",
                                     "tests/engines/test_trainer_preflight.py", "tests/train/test_disk.py",
                                     "tests/train/test_train_async.py"], None),
    # trainer=policy_gradient's target: one worker in process, N through the driver; the disk line
    "pipeline/train/build.py": (["tests/train/test_build.py"], None),
    # trainer=function: the user's train function, its metrics, version and state
    "pipeline/train/function.py": (["tests/train/test_function_trainer.py", "tests/train/test_train_sync.py"], None),
    # which weights reach which engine after an update (full, LoRA adapter folders, object refs)
    "pipeline/train/sync.py": (["tests/train/test_train_sync.py", "tests/train/test_trainer_real_model.py",
                                "tests/engines/test_vllm_follows_trainer.py"], None),
    # the policy's load, LoRA wrap, reference model, merged weights and HF export
    "pipeline/train/model.py": (["tests/train/test_file_modes.py", "tests/train/test_shared_prompt.py",
                                 "tests/train/test_distributed_fast.py", "tests/train/test_disk.py",
                                 "tests/train/test_train_sync.py", "tests/train/test_policy_gradient.py",
                                 "tests/train/test_model.py"], None),
    # the one-process answers of the trainer's process group
    "pipeline/train/parallel.py": (["tests/train/test_policy_gradient.py", "tests/train/test_distributed_fast.py",
                                    "tests/train/test_policy_gradient_parallel.py"], None),
    # which worker trains which samples (token-balanced shares)
    "pipeline/train/distributed/split.py": (["tests/train/test_distributed_split.py",
                                             "tests/train/test_distributed_fast.py"], None),
    # FSDP2 / DDP and the collectives, on a one-rank gloo group (a stand-in plays a second worker)
    # (and test_gloo_comm.py: which collectives a gloo group's FSDP2 units get)
    "pipeline/train/distributed/strategy.py": (["tests/train/test_distributed_fast.py",
                                                "tests/train/test_gloo_comm.py"], None),
    # FSDP2's all-gather / reduce-scatter through gloo's broadcast and all-reduce (the real groups:
    # tests/train/test_gloo_comm_groups.py, spawned processes, which do not see mutants)
    "pipeline/train/distributed/gloo_comm.py": (["tests/train/test_gloo_comm.py"], None),
    # gathered weights (LoRA merged), DCP checkpoints both ways
    "pipeline/train/distributed/shards.py": (["tests/train/test_distributed_fast.py",
                                              "tests/train/test_shards_local.py"], None),
    # one rank as a plain object (not `where`: it asks Ray; tests/train/test_distributed_trainer.py)
    "pipeline/train/distributed/worker.py": (["tests/train/test_distributed_fast.py"],
                                             [f"pipeline.train.distributed.worker.xǁTrainerWorkerǁ{fn}__mutmut_*"
                                              for fn in ("__init__", "free_port", "init_group", "build", "peak_rss_mb",
                                                         "close", "_trainer", "train", "weights", "adapter",
                                                         "counters", "save", "load")]),
    # the driver with a stand-in WorkerGroup (all of it)
    "pipeline/train/distributed/driver.py": (["tests/train/test_distributed_fast.py",
                                              "tests/train/test_distributed_split.py"], None),
    # calls, failures and shutdown with stand-ins for Ray's wait/get/kill (not `start`: placing the
    # workers needs a Ray cluster; tests/train/test_distributed_trainer.py)
    "pipeline/train/distributed/group.py": (["tests/train/test_distributed_fast.py"],
                                            ["pipeline.train.distributed.group.x_worker_env__mutmut_*",
                                             *[f"pipeline.train.distributed.group.xǁWorkerGroupǁ{fn}__mutmut_*"
                                               for fn in ("__init__", "call_one", "call", "_wait", "_dead_peer", "_died",
                                                          "close")]]),
    # the allowlist part of the plugin table (moved from the old pipeline/config.py module)
    "pipeline/config/plugins.py": (["tests/test_allowlist.py", "tests/test_security.py",
                             "tests/test_config.py"],
                            [f"pipeline.config.plugins.x_{fn}__mutmut_*" for fn in (
                                "_allowed_prefixes", "check_allowed", "load_object", "_import_hint", "_check_origin",
                                "_check_tree", "allowed_targets")]),
    # the Sample's growth and meta_info folding (slime's append_response_tokens), its dict form (issue 31)
    "pipeline/samples/sample.py": (["tests/data/test_sample.py", "tests/data/test_sample_slime.py"], None),
    # override quoting both ways and the `+key` typo warning with its edit distance (issue 31)
    "pipeline/run/overrides.py": (["tests/test_overrides.py"], None),
    # a fresh run's explicit dir: the refusals before Hydra writes, paths.output_dir as Hydra's run dir
    "pipeline/run/fresh_run.py": (["tests/test_fresh_run.py"], None),
    # the run record: stored overrides and their upgrades, resume checks, the change log (issue 32)
    "pipeline/run/run_record.py": (["tests/test_run_record.py", "tests/test_run_dir.py",
                                    "tests/resume/test_resume_upgrade.py", "tests/resume/test_resume_kill.py"], None),
    # one run per run dir: the lock, a dead holder taken over after a crash (issue 32)
    "pipeline/run/run_lock.py": (["tests/test_run_dir.py", "tests/test_fresh_run.py",
                                  "tests/test_bad_inputs_pipeline.py", "tests/resume/test_resume_kill.py"], None),
    # fixed and adaptive over-sampling, its state across a kill (issue 32)
    "pipeline/rollout/over_sampling.py": (["tests/rollout/test_over_sampling.py",
                                           "tests/rollout/test_plugins_and_adaptive.py",
                                           "tests/rollout/test_train_run_items.py",
                                           "tests/rollout/test_buffer_headline.py",
                                           "tests/resume/test_resume_kill.py"], None),
    # token weight versions, staleness and its buffer bound (issue 32)
    "pipeline/samples/versions.py": (["tests/rollout/test_weight_versions.py", "tests/rollout/test_train_run_items.py",
                                      "tests/rollout/test_engine_rollout.py", "tests/rollout/test_sample_generate.py",
                                      "tests/data/test_buffer_filter_order.py", "tests/data/test_checkpoint.py",
                                      "tests/data/test_property.py", "tests/data/test_sample.py",
                                      "tests/train/test_train_async.py",
                                      "tests/train/test_train_async_real.py"], None),
    # the batched sampler of the static decode path: temperature, top-k / top-p, seeded rows (issue 32)
    "pipeline/engines/hf_sampling.py": (["tests/engines/test_hf_static.py", "tests/engines/test_native_kernels.py",
                                         "tests/engines/test_hf_engine.py"], None),
}

# Each test's limits in a module's run (tests/conftest.py applies them). The CPU-time cap is the
# guard against a mutant that makes a test spin: it costs that many CPU seconds, however busy the
# machine is (a wall-clock cap would also count the time other jobs hold the CPU and fail slow
# tests that are no hang); the idle cap is the guard against one that makes a test wait forever
# (an event loop with nothing left to run): seconds the main thread spends neither running nor
# waiting for a CPU (tests/cpu_guard.py). The rollout tests use under a second each, and mutants
# of the generate path and the rollout's loop often make a rollout spin or wait (every group
# dropped, a sample that never finishes), so there both caps are a few seconds. The wall-clock
# cap is the last resort. ROLLOUT_PIPELINE_TEST_CPU_CAP, ROLLOUT_PIPELINE_TEST_IDLE_CAP and
# ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP override them.
DEFAULT_TEST_CPU_CAP, DEFAULT_TEST_IDLE_CAP = 10, 15
TEST_CPU_CAP: dict[str, int] = {
    "pipeline/rollout/sample_generate.py": 4,
    "pipeline/rollout/train_run.py": 4,
}
TEST_IDLE_CAP: dict[str, int] = {
    "pipeline/rollout/sample_generate.py": 4,
    "pipeline/rollout/train_run.py": 4,
    # test_resume_kill.py's clean run waits on its killed child longer than 15 s
    "pipeline/rollout/over_sampling.py": 90,
}
TEST_WALL_CAP = 120

# copied into the scratch tree (tests read bundled configs and prompt files by path)
COPY = ["pipeline", "tests", "conf", "data", "examples", "run.py", "README.md", "docs"]
# mutmut exit codes -> the report's columns (mutmut.stats.status_by_exit_code, abridged)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}


def slug(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


def mutmut_config(module: str, tests: list[str]) -> str:
    """The `[tool.mutmut]` section of the scratch tree's pyproject.toml."""
    return "\n".join([
        "", "[tool.mutmut]",
        'source_paths = ["pipeline/"]',
        f"only_mutate = {json.dumps([module])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        # no cache dir in the scratch tree; fast tests only
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-m", "not slow"]',
        f"also_copy = {json.dumps([c for c in COPY if c not in ('pipeline', 'tests')])}",
        "timeout_multiplier = 10.0",
        "timeout_constant = 5.0",
        "",
    ])


def prepare(module: str, tests: list[str]) -> Path:
    """A fresh scratch copy of the repo for one module's run."""
    work = WORK / slug(module)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, work / name)
    text = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(text + mutmut_config(module, tests))
    return work


def refresh(module: str, tests: list[str]) -> Path:
    """Bring the current tests into the module's existing scratch tree (mutmut keeps its results)."""
    work = WORK / slug(module)
    shutil.rmtree(work / "tests")
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + mutmut_config(module, tests))
    return work


def survivors_of_last_run(module: str) -> list[str]:
    """Mutants of the module's last run that were not killed and are not known equivalents."""
    meta = WORK / slug(module) / "mutants" / (module + ".meta")
    if not meta.exists():
        return []
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(k for k, v in codes.items() if STATUS.get(v, "suspicious") in ("survived", "no tests", "suspicious")
                  and k not in EQUIVALENT)


def unchecked_of_last_run(module: str) -> list[str]:
    """Mutants of the module (within its globs) that its last run stopped before checking."""
    meta = WORK / slug(module) / "mutants" / (module + ".meta")
    if not meta.exists():
        return []
    names = MODULES[module][1]
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(k for k, v in codes.items() if v is None
                  and (names is None or any(fnmatch.fnmatchcase(k, pat) for pat in names)))


def run_module(module: str, timeout_s: int, rerun_survivors: bool = False, resume: bool = False) -> dict:
    """Run mutmut on one module in a fresh scratch tree (or only on the survivors of its last
    run, or on what its last run left unchecked, with the current tests); returns `collect(module)`."""
    tests, names = MODULES[module]
    meta = WORK / slug(module) / "mutants" / (module + ".meta")
    before: dict[str, int | None] = {}
    again = rerun_survivors or resume
    if again and meta.exists():
        names = survivors_of_last_run(module) if rerun_survivors else unchecked_of_last_run(module)
        if not names:
            return collect(module)
        before = json.loads(meta.read_text())["exit_code_by_key"]
        work = refresh(module, tests)
    else:
        work = prepare(module, tests)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           # a mutant that makes a test spin or hang costs these seconds, not the test's own limit
           "ROLLOUT_PIPELINE_TEST_CPU_CAP": os.environ.get(
               "ROLLOUT_PIPELINE_TEST_CPU_CAP", str(TEST_CPU_CAP.get(module, DEFAULT_TEST_CPU_CAP))),
           "ROLLOUT_PIPELINE_TEST_IDLE_CAP": os.environ.get(
               "ROLLOUT_PIPELINE_TEST_IDLE_CAP", str(TEST_IDLE_CAP.get(module, DEFAULT_TEST_IDLE_CAP))),
           "ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP": os.environ.get("ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP", str(TEST_WALL_CAP))}
    mutmut = [sys.executable, "-m", "mutmut"]
    start = time.monotonic()
    cmd = mutmut + ["run", "--max-children", "1"] + list(names or [])
    logger.info("%s: %s (tests: %s)", module, " ".join(cmd[2:]), " ".join(tests))
    log = (work / "mutmut.log").open("w")
    try:
        subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        finished = True
    except subprocess.TimeoutExpired:
        finished = False
    if before and meta.exists():  # mutmut forgets the other verdicts when the tests change: keep them
        data = json.loads(meta.read_text())
        data["exit_code_by_key"] = {**before, **{k: data["exit_code_by_key"].get(k) for k in names}}
        meta.write_text(json.dumps(data))
    info = {"seconds": time.monotonic() - start, "finished": finished}
    if again and (work / "run.json").exists():  # the first run's time plus this one
        last = json.loads((work / "run.json").read_text())
        info = {"seconds": last["seconds"] + info["seconds"],
                "finished": finished and (last["finished"] or resume)}
    (work / "run.json").write_text(json.dumps(info))
    return collect(module)


def collect(module: str) -> dict:
    """Results of the last run of `module` (from mutmut's files in its scratch tree)."""
    tests, names = MODULES[module]
    work = WORK / slug(module)
    run_info = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
    seconds, finished = run_info.get("seconds", 0.0), run_info.get("finished", False)
    meta = work / "mutants" / (module + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    if names:
        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatchcase(k, pat) for pat in names)}
    counts: Counter[str] = Counter(STATUS.get(code, "suspicious") for code in codes.values())
    survivors, timeouts = [], []
    for name, code in sorted(codes.items()):
        status = STATUS.get(code, "suspicious")
        if status == "timeout":
            timeouts.append(name)
        elif status in ("survived", "no tests", "suspicious"):
            if name in EQUIVALENT:
                counts["equivalent"] += 1
            survivors.append((name, status))
    diffs = mutant_diffs(work, module, [name for name, _ in survivors])
    survivors = [(name, status, diffs.get(name, "")) for name, status in survivors]
    return {"counts": dict(counts), "survivors": survivors, "timeouts": timeouts, "seconds": seconds,
            "finished": finished, "tests": tests}


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({name: get_diff_for_mutant(name, path=sys.argv[1]) for name in json.load(sys.stdin)}))
"""


def mutant_diffs(work: Path, module: str, names: list[str]) -> dict[str, str]:
    """The diff of each named mutant (one process for all of them)."""
    if not names:
        return {}
    out = subprocess.run([sys.executable, "-c", _DIFFS, module], cwd=work, input=json.dumps(names),
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        logger.warning("%s: no diffs (%s)", module, out.stderr.strip()[-500:])
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict]) -> str:
    """Markdown: the score table, then every mutant not killed (with its diff) and timeouts."""
    lines = ["# Mutation report", "",
             "Score = (killed + timeout) / (mutants run - equivalent); equivalent survivors are listed with their reason in",
             "scripts/mutation_equivalents.py. A timeout is a mutant the tests caught only by hanging.", "",
             "| module | mutants | not run | killed | timeout | equivalent | survived | score | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for module, r in results.items():
        c = r["counts"]
        total = sum(v for k, v in c.items() if k != "equivalent")
        not_run = c.get("not checked", 0)
        detected = c.get("killed", 0) + c.get("timeout", 0)
        equivalent = c.get("equivalent", 0)
        unexplained = total - not_run - detected - equivalent
        scored = total - not_run - equivalent
        score = f"{100 * detected / scored:.1f}%" if scored > 0 else "-"
        note = "" if r["finished"] else " (stopped at the time limit)"
        lines.append(f"| {module}{note} | {total} | {not_run} | {c.get('killed', 0)} | {c.get('timeout', 0)} | "
                     f"{equivalent} | {unexplained} | {score} | {r['seconds']:.0f} |")
    for module, r in results.items():
        if r["survivors"] or r["timeouts"]:
            lines += ["", f"## {module}", ""]
        for name, status, diff in r["survivors"]:
            why = EQUIVALENT.get(name)
            head = f"equivalent: {why}" if why else f"{status.upper()}: kill it with a test or explain it"
            lines += [f"### {name}", head, "```diff", diff, "```"]
        if r["timeouts"]:
            lines += ["Caught only by a timeout: " + ", ".join(r["timeouts"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="module paths (default: every covered module)")
    parser.add_argument("--list", action="store_true", help="print the module -> tests map and exit")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per module (default 1800)")
    parser.add_argument("--rerun-survivors", action="store_true",
                        help="run only the last run's unexplained survivors again, with the current tests")
    parser.add_argument("--resume", action="store_true",
                        help="run only the mutants the last run left unchecked (stopped at the time limit)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the report from the last run of each module (no mutmut run)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for module, (tests, names) in MODULES.items():
            logger.info("%s%s\n    %s", module, f" ({', '.join(names)})" if names else "", "\n    ".join(tests))
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"not covered: {unknown}; covered modules: {sorted(MODULES)}")
    results = {}
    for module in args.modules or list(MODULES):
        if args.report_only and not (WORK / slug(module) / "mutants").exists():
            continue
        results[module] = (collect(module) if args.report_only
                           else run_module(module, args.timeout, args.rerun_survivors, args.resume))
        logger.info("%s: %s in %.0f s", module, results[module]["counts"], results[module]["seconds"])
        (WORK / "report.md").write_text(report(results))  # after each module: a stopped run keeps its report
    sys.stdout.write(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
