"""Soak test of crash-exact resume: SIGKILL a CLI run many times, resume each time, compare.

    .venv/bin/python scripts/soak_resume.py --kills 20 [--rollouts 30] [--seed 0] [--work DIR]

Runs an uninterrupted reference (deterministic mode, scripted engine with a per-token delay and
random jitter, buffered source, nonzero_std dynamic filter, partial rollout, save_interval=1),
then one run killed at `--kills` moments cycling through generation, reward, train-data write,
checkpoint write and random times, resumed after each kill. Compares batches, prompts per epoch,
the final buffer and the sample dumps (see tests/resume/harness.py) and prints a summary.
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


def main() -> int:
    """Parse the flags, run the soak, print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs, spread over the run")
    ap.add_argument("--rollouts", type=int, default=30, help="num_rollout of the run")
    ap.add_argument("--prompts", type=int, default=10, help="prompts in the generated data file")
    ap.add_argument("--seed", type=int, default=0, help="picks the kill moments")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temp dir)")
    opts = ap.parse_args()
    work = opts.work or Path(tempfile.mkdtemp(prefix="soak_resume_"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
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


if __name__ == "__main__":
    sys.exit(main())
