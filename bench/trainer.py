"""Trainer benchmark (`make bench-trainer`; not in CI): our pipeline with `trainer=policy_gradient`
against TRL's `GRPOTrainer`, side by side in one run, on the same model (SmolLM2-135M-Instruct),
prompts (data/math_train.jsonl), reward (pipeline/rewards/math.py), samples per step, new tokens
and learning rate.

Reported per trainer: seconds per step (ours split into generation and training), held-out greedy
pass@1 on data/math_eval.jsonl before and after the same number of steps (each trainer's own
eval, and both final policies through one common evaluator: float32 `model.generate`), and the
ratio of seconds per step (target: ours <= 1/3 of TRL's). TRL runs in its own virtualenv (`.venv-trl/`,
built by scripts/trl_venv.sh on first use: trl 1.16.0 beside torch 2.13.0 CPU); it is not a
dependency of the project.

With several seeds (`--seeds 1 2 3`) each trainer runs once per data seed, every final policy goes
through the common evaluator, and the report adds mean +- std of pass@1 per trainer: one run of
10 steps x 4 prompts is too noisy (60 eval prompts, 40 training prompts) to rank two trainers.

Usage: python bench/trainer.py [--steps 5] [--prompts-per-step 4] [--n 4] [--new-tokens 48]
       [--lr 1e-5] [--seeds 1 [2 ...]] [--skip-trl] [--skip-ours] [--skip-eval] [--no-own-eval]
       [--ours-override KEY=VALUE ...] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRL_VENV = ROOT / ".venv-trl"


def _model_folder() -> str:
    """The converted HF folder of the bundled model (converted once into the cache)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.engines.assets import resolve_checkpoint

    return resolve_checkpoint("smollm2-135m-instruct")


def run_trl(a: argparse.Namespace, seed: int, model: str, out_dir: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer in .venv-trl (bench/trl_grpo.py) with data seed `seed`; returns its JSON
    result (its policy, unless --skip-eval, in out_dir/trl_policy)."""
    if not (TRL_VENV / "bin" / "python").exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "trl_venv.sh"), str(TRL_VENV)], check=True)
    out = out_dir / "trl.json"
    cmd = [str(TRL_VENV / "bin" / "python"), str(ROOT / "bench" / "trl_grpo.py"), "--model", model,
           "--prompts-per-step", str(a.prompts_per_step), "--n", str(a.n), "--new-tokens", str(a.new_tokens),
           "--lr", str(a.lr), "--steps", str(a.steps), "--seed", str(seed), "--out", str(out)]
    cmd += ["--skip-eval"] if a.skip_eval or a.no_own_eval else []
    cmd += [] if a.skip_eval else ["--save-policy", str(out_dir / "trl_policy")]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return {**json.loads(out.read_text()), "seed": seed}


def run_ours(a: argparse.Namespace, seed: int, out_dir: Path) -> dict[str, Any]:
    """`python run.py experiment=learn` sized like the TRL run, data seed `seed`; reads its
    metrics.jsonl (its policy in out_dir/ours/policy)."""
    run_dir = out_dir / "ours"
    overrides = ["experiment=learn", f"num_rollout={a.steps}", f"rollout_batch_size={a.prompts_per_step}",
                 f"n_samples_per_prompt={a.n}", f"rollout_max_response_len={a.new_tokens}",
                 f"trainer.lr={a.lr}",
                 # like for like with TRL: every generated group trains (no dynamic sampling)
                 "dynamic_filter=none", "rollout.over_sampling=fixed",
                 f"data_source.seed={seed}", "logger=jsonl", f"hydra.run.dir={run_dir}", *a.ours_override]
    overrides += (["eval_interval=null", "eval_before_train=false"] if a.skip_eval or a.no_own_eval
                  else [f"eval_interval={a.steps}", "eval_before_train=true"])
    subprocess.run([sys.executable, "run.py", *overrides], check=True, cwd=ROOT)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "perf/train_time" in r]
    evals = [r["eval/math"] for r in rows if "eval/math" in r]
    generate = [r["perf/rollout_time"] for r in steps]
    train = [r["perf/train_time"] + r.get("perf/weight_sync_time", 0.0) for r in steps]
    return {"trainer": "ours", "seed": seed, "steps": len(steps), "seconds_per_step": [g + t for g, t in zip(generate, train)],
            "generate_s": generate, "train_s": train,
            "pass_at_1_before": evals[0] if len(evals) > 1 else None,
            "pass_at_1_after": evals[-1] if evals else None,
            "reward_per_step": [r.get("rollout/raw_reward") for r in steps], "load_average": os.getloadavg()[0]}


def common_eval(a: argparse.Namespace, folders: dict[str, Path], out_dir: Path) -> dict[str, float]:
    """Held-out greedy pass@1 of each HF folder with one evaluator (bench/trl_grpo.py's float32
    `model.generate` with the chat template), so both trainers' "before" and "after" compare
    like for like; returns {name: pass@1}."""
    out = out_dir / "common_eval.json"
    cmd = [str(TRL_VENV / "bin" / "python"), str(ROOT / "bench" / "trl_grpo.py"), "--new-tokens", str(a.new_tokens),
           "--out", str(out), "--eval-only", *map(str, folders.values())]
    subprocess.run(cmd, check=True, cwd=ROOT)
    scores = json.loads(out.read_text())["pass_at_1"]
    return {name: scores[str(folder)] for name, folder in folders.items()}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {spread:.3f} (n={len(values)})"


def report(results: list[dict[str, Any]]) -> str:
    """A Markdown table of the runs, then per trainer the median seconds per step over all its
    steps, the mean +- std of pass@1 on the common evaluator over seeds, and the ours / TRL ratio."""
    lines = ["| trainer | seed | steps | s/step (median) | generate s | train s | pass@1 before | pass@1 after | "
             "pass@1 after, common evaluator | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        med = statistics.median(r["seconds_per_step"]) if r["seconds_per_step"] else None
        gen = statistics.median(r["generate_s"]) if r.get("generate_s") else None
        train = statistics.median(r["train_s"]) if r.get("train_s") else None
        lines.append(f"| {r['trainer']} | {r['seed']} | {r['steps']} | {_fmt(med, '.1f')} | {_fmt(gen, '.1f')} | "
                     f"{_fmt(train, '.1f')} | {_fmt(r['pass_at_1_before'])} | {_fmt(r['pass_at_1_after'])} | "
                     f"{_fmt(r.get('pass_at_1_common'), '.3f')} | {r['load_average']:.1f} |")
    medians = {}
    lines.append("")
    for trainer in dict.fromkeys(r["trainer"] for r in results):
        runs = [r for r in results if r["trainer"] == trainer]
        steps = [t for r in runs for t in r["seconds_per_step"]]
        medians[trainer] = statistics.median(steps) if steps else None
        common = [r["pass_at_1_common"] for r in runs if r.get("pass_at_1_common") is not None]
        lines.append(f"- {trainer}: s/step median over {len(steps)} steps {_fmt(medians[trainer], '.2f')}; "
                     f"pass@1 after, common evaluator: {_mean_std(common)}")
    if medians.get("ours") and medians.get("trl"):
        lines.append(f"\nours / TRL seconds per step: {medians['ours'] / medians['trl']:.3f} (target <= 0.333)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="data seeds, one run of each trainer per seed")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--skip-eval", action="store_true", help="no pass@1 (seconds per step only)")
    parser.add_argument("--no-own-eval", action="store_true",
                        help="only the common evaluator (skips each trainer's own before / after evals)")
    parser.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra Hydra override for our run (repeatable), e.g. trainer.bf16=false")
    parser.add_argument("--out-dir", default=None,
                        help="keep the runs, policies and results.json here (default: a temporary folder)")
    a = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        out = Path(a.out_dir or tmp)
        results, folders = [], {"before": Path(_model_folder())}
        for seed in a.seeds:
            seed_dir = out / f"seed{seed}"
            seed_dir.mkdir(parents=True, exist_ok=True)
            if not a.skip_ours:
                results.append(run_ours(a, seed, seed_dir))
                folders[f"ours/{seed}"] = seed_dir / "ours" / "policy"
            if not a.skip_trl:
                results.append(run_trl(a, seed, _model_folder(), seed_dir))
                folders[f"trl/{seed}"] = seed_dir / "trl_policy"
        if not a.skip_eval and results:
            scores = common_eval(a, folders, out)
            for r in results:
                r["pass_at_1_common"] = scores[f"{r['trainer']}/{r['seed']}"]
            sys.stdout.write(f"common evaluator: pass@1 {scores['before']:.3f} before training\n")
        text = report(results)
        (out / "results.json").write_text(json.dumps({"args": vars(a), "runs": results}, indent=1))
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
