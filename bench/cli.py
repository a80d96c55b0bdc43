"""Command-line latency benchmark (`make bench-cli`; not in CI): how long `python run.py` takes to
answer, start and finish, for this checkout and another git revision side by side.

The other revision is checked out with `git worktree` into a temp folder and run with the same
Python (the project's venv), so only the code differs. Runs alternate (before, after, before,
...) so a slow minute of a shared machine hits both. Commands:

- `--help`, `--cfg job`, a command refused at pre-flight (`rollout_batch_size=-1`): wall time;
- one rollout of the real model (2 prompts x 2 samples, 8 tokens, jsonl logger): wall time,
  seconds until the run's first log line (start-up: imports, Hydra, pre-flight), and seconds from
  its last log line to the process's exit (shut-down);
- one rollout with `trainer=policy_gradient` (full fine-tuning, one optimizer step, the final
  policy exported): wall time and the seconds its export took (the log line before it to its
  "final policy written" line).

Prints a Markdown table of medians, before / after and their ratio.

Usage: python bench/cli.py [--before REV] [--repeats 3] [--skip-train]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from learn import log_time  # bench/learn.py: run.log's stamps

ROOT = Path(__file__).resolve().parents[1]
TINY = ["logger=jsonl", "rollout_batch_size=2", "n_samples_per_prompt=2", "rollout_max_response_len=8",
        "num_rollout=1", "rollout.progress=false", "rollout.summary=false"]


def run_once(checkout: Path, args: list[str], run_dir: Path | None, ok_codes: tuple[int, ...]) -> dict[str, float]:
    """One command in `checkout`; wall time, and with a run dir its start-up, shut-down and export."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1")
    extra = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    start = datetime.now()  # local and naive, as run.log's stamps
    proc = subprocess.run([sys.executable, "run.py", *args, *extra], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=900)
    end = datetime.now()
    if proc.returncode not in ok_codes:
        raise SystemExit(f"{checkout}: run.py {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = {"wall": (end - start).total_seconds()}
    if run_dir is not None:
        lines = [(t, line) for line in (run_dir / "run.log").read_text().splitlines()
                 if (t := log_time(line)) is not None]
        out["start-up"] = (lines[0][0] - start).total_seconds()
        out["shut-down"] = (end - lines[-1][0]).total_seconds()
        for (t0, _), (t1, line) in zip(lines, lines[1:]):
            if "final policy written" in line:
                out["export"] = (t1 - t0).total_seconds()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="HEAD", help="git revision to compare with (default HEAD: the "
                        "working tree's uncommitted changes against the last commit)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-train", action="store_true")
    opts = parser.parse_args()

    cases: list[tuple[str, list[str], bool, tuple[int, ...]]] = [
        ("--help", ["--help"], False, (0,)),
        ("--cfg job", ["--cfg", "job"], False, (0,)),
        ("refused at pre-flight", ["rollout_batch_size=-1"], False, (1,)),
        ("1 rollout, real model", TINY, True, (0,)),
    ]
    if not opts.skip_train:
        cases.append(("1 rollout + training + export", TINY + ["trainer=policy_gradient"], True, (0,)))

    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), opts.before], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            checkouts = {"before": before, "after": ROOT}
            results: dict[tuple[str, str], list[dict[str, float]]] = {}
            for name, args, with_dir, codes in cases:
                for i in range(opts.repeats):
                    for side, checkout in checkouts.items():
                        run_dir = Path(tmp) / f"run_{side}_{len(results)}_{i}" if with_dir else None
                        results.setdefault((name, side), []).append(run_once(checkout, args, run_dir, codes))
                        print(f"{name} [{side}] {results[(name, side)][-1]}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)

    print(f"before: {opts.before}; after: the working tree; medians of {opts.repeats} alternating runs (s)\n")
    print("| command | measure | before | after | after / before |")
    print("|---|---|---|---|---|")
    for name, _, _, _ in cases:
        for measure in ("wall", "start-up", "shut-down", "export"):
            b = [r[measure] for r in results[(name, "before")] if measure in r]
            a = [r[measure] for r in results[(name, "after")] if measure in r]
            if a and b:
                mb, ma = statistics.median(b), statistics.median(a)
                print(f"| `{name}` | {measure} | {mb:.2f} | {ma:.2f} | {ma / mb:.2f} |")


if __name__ == "__main__":
    main()
