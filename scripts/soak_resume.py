"""Soak test of crash-exact resume: SIGKILL a CLI run many times, resume each time, compare.

    .venv/bin/python scripts/soak_resume.py --kills 20 [--rollouts 30] [--seed 0] [--work DIR]
    .venv/bin/python scripts/soak_resume.py --trainer-workers 2 --kills 5 [--rollouts 8]

Runs an uninterrupted reference (deterministic mode, scripted engine with a per-token delay and
random jitter, buffered source, nonzero_std dynamic filter, partial rollout, save_interval=1),
then one run killed at `--kills` moments cycling through generation, reward, train-data write,
checkpoint write and random times, resumed after each kill. Compares batches, prompts per epoch,
the final buffer and the sample dumps (see tests/resume/harness.py) and prints a summary.
With `--trainer-workers N` training is on (the tiny policy of tests/resume/train_harness.py
behind the real hf engine, trainer.num_workers=N on gloo) and every kill is a SIGKILL of one
trainer worker (a random rank) inside a random rollout's training step; the run must stop by
itself naming the worker, and each resume continues from the newest checkpoint. Compared as
above, plus the loss curve (every train/* metric) and the exported policy bit for bit.
Exit status 1 when anything was lost, duplicated or differs.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "resume"))
import harness  # noqa: E402
import train_harness  # noqa: E402


def main() -> int:
    """Parse the flags, run the soak, print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs, spread over the run")
    ap.add_argument("--rollouts", type=int, default=30, help="num_rollout of the run")
    ap.add_argument("--prompts", type=int, default=10, help="prompts in the generated data file")
    ap.add_argument("--seed", type=int, default=0, help="picks the kill moments")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temp dir)")
    ap.add_argument("--trainer-workers", type=int, default=0,
                    help="train with this many torch.distributed workers and kill workers (0: no trainer)")
    opts = ap.parse_args()
    work = opts.work or Path(tempfile.mkdtemp(prefix="soak_resume_"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
    if opts.trainer_workers:
        return soak_workers(opts, work, rng)
    data = harness.write_prompts(work / "prompts.jsonl", opts.prompts)
    base = harness.overrides(data, opts.rollouts, True)
    start = time.monotonic()
    harness.run_to_end(base + [f"hydra.run.dir={work / 'ref'}"])
    # each kill lands within the first rollouts of a (resumed) process: enough rollouts keep the
    # run from finishing before the last kill
    kills = harness.plan_kills(rng, opts.kills)
    got, killed, resumes = harness.killed_run(work, base, kills, rng)
    result = harness.compare(work / "ref", got, opts.rollouts, data, opts.prompts, 3, deterministic=True)
    ok = not result.problems and result.lost == 0 and result.duplicated == 0 and killed == opts.kills
    print(f"soak_resume: kills={killed}/{opts.kills} resumes={resumes} rollouts={opts.rollouts} "
          f"groups_compared={result.groups_compared} lost={result.lost} duplicated={result.duplicated} "
          f"dumps_identical={not result.problems} time={time.monotonic() - start:.0f}s "
          f"{'PASS' if ok else 'FAIL'} (work dir {work})")
    by_point = Counter(point for point, _ in kills[:killed])
    print("  kills by moment: " + ", ".join(f"{p}={by_point[p]}" for p in harness.POINTS))
    for problem in result.problems:
        print(f"  {problem}")
    return 0 if ok else 1


def soak_workers(opts: argparse.Namespace, work: Path, rng: random.Random) -> int:
    """`--trainer-workers`: kill trainer workers mid-step, resume, compare (module docstring)."""
    from safetensors.torch import load_file

    start = time.monotonic()
    data = harness.write_prompts(work / "prompts.jsonl", opts.prompts)
    policy = train_harness.tiny_policy(work / "policy")
    base = train_harness.train_overrides(data, policy, opts.rollouts) + [
        f"trainer.num_workers={opts.trainer_workers}", "trainer.collective_timeout_s=120"]
    harness.run_to_end(base + [f"hydra.run.dir={work / 'ref'}"])
    run_dir, killed, resumes, messages = work / "killed", 0, 0, 0
    for i in range(opts.kills):
        has_ckpt = any((run_dir / "checkpoints").glob("rollout_*.json")) if run_dir.exists() else False
        args = base + ([f"resume={run_dir}"] if has_ckpt else [])
        target = work / f"rec{i}" if has_ckpt else run_dir
        resumes += has_ckpt
        # the driver's first train call of this process (or its second), a worker killed inside it
        code, log = train_harness.kill_worker(args, target, work / "marks.txt", nth=rng.randint(1, 2),
                                              rank=rng.randrange(opts.trainer_workers), pause=0.0,
                                              delay=rng.uniform(0.0, 0.05), log_dir=run_dir)
        if code == 0:
            break  # finished before the kill point
        killed += 1
        messages += "died during" in log and f"resume={run_dir}" in log
    has_ckpt = any((run_dir / "checkpoints").glob("rollout_*.json"))
    harness.run_to_end(base + ([f"resume={run_dir}", f"hydra.run.dir={work / 'rec_final'}"] if has_ckpt
                               else [f"hydra.run.dir={run_dir}"]))
    resumes += has_ckpt
    result = harness.compare(work / "ref", run_dir, opts.rollouts, data, opts.prompts, 2, deterministic=True)
    problems = list(result.problems)
    if train_harness.train_curve(run_dir) != train_harness.train_curve(work / "ref"):
        problems.append("train/* metrics differ from the uninterrupted run's")
    a, b = (load_file(str(d / "policy" / "model.safetensors")) for d in (work / "ref", run_dir))
    if a.keys() != b.keys() or not all((a[k] == b[k]).all() for k in a):
        problems.append("the exported policy differs from the uninterrupted run's")
    ok = not problems and result.lost == 0 and result.duplicated == 0 and killed == opts.kills and messages == killed
    print(f"soak_resume: trainer workers={opts.trainer_workers} worker kills={killed}/{opts.kills} "
          f"(each naming the worker and the resume command: {messages}) resumes={resumes} "
          f"rollouts={opts.rollouts} groups_compared={result.groups_compared} lost={result.lost} "
          f"duplicated={result.duplicated} identical={not problems} time={time.monotonic() - start:.0f}s "
          f"{'PASS' if ok else 'FAIL'} (work dir {work})")
    for problem in problems:
        print(f"  {problem}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
