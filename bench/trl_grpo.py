"""TRL's side of `bench/trainer.py`: GRPO with TRL's `GRPOTrainer` on the same model, prompts,
reward, samples per step, new tokens and learning rate as ours. Runs inside `.venv-trl/`
(built by `scripts/trl_venv.sh`); writes one JSON file of results.

It imports nothing of this project but the math grader, loaded by file so that the same
extraction + math-verify rule scores both trainers (this venv does not install the project).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _grader():
    """`pipeline/rewards/math.py:grade`, loaded from its file (the project is not installed here)."""
    spec = importlib.util.spec_from_file_location("bench_math_grader", ROOT / "pipeline" / "rewards" / "math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grade


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def greedy_pass_at_1(model, tokenizer, rows: list[dict], new_tokens: int, grade, batch: int = 32) -> float:
    """Held-out greedy pass@1: the share of prompts whose greedy answer grades 1."""
    import torch

    tokenizer.padding_side = "left"
    correct = 0
    model.eval()
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["input"]}], tokenize=False,
                                               add_generation_prompt=True) for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for row, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            correct += grade(tokenizer.decode(ids, skip_special_tokens=True), row["label"])
    model.train()
    return correct / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF folder of the policy (required unless --eval-only)")
    parser.add_argument("--train", default=str(ROOT / "data" / "math_train.jsonl"))
    parser.add_argument("--eval", default=str(ROOT / "data" / "math_eval.jsonl"))
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--save-policy", default=None, help="write the trained policy here (HF folder)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--eval-only", nargs="+", default=None, metavar="FOLDER",
                        help="no training: held-out greedy pass@1 of these HF folders (the same evaluator for "
                             "both trainers' policies)")
    a = parser.parse_args()
    if a.eval_only:
        _write_json(a.out, {"pass_at_1": {folder: evaluate_folder(folder, Path(a.eval), a.new_tokens, a.threads)
                                          for folder in a.eval_only}})
        return
    if not a.model:
        parser.error("--model is required (unless --eval-only)")

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    grade = _grader()
    train_rows = _rows(Path(a.train))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["input"]}], "label": r["label"]}
                                 for r in train_rows])

    def math_reward(completions, label, **_):
        return [grade(c[-1]["content"] if isinstance(c, list) else c, gold) for c, gold in zip(completions, label)]

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    eval_rows = _rows(Path(a.eval))
    pass_before = None if a.skip_eval else greedy_pass_at_1(model, tokenizer, eval_rows, a.new_tokens, grade)

    step_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)

    out_dir = Path(a.out).with_suffix(".trl_out")
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, seed=a.seed, learning_rate=a.lr, max_steps=a.steps,
        per_device_train_batch_size=a.prompts_per_step * a.n, num_generations=a.n,
        max_completion_length=a.new_tokens, gradient_accumulation_steps=1, steps_per_generation=1,
        temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to="none",
        bf16=False, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    pass_after = None if a.skip_eval else greedy_pass_at_1(trainer.model, tokenizer, eval_rows, a.new_tokens, grade)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    result = {"trainer": "trl", "steps": len(step_times), "seconds_per_step": step_times, "train_wall_s": wall,
              "pass_at_1_before": pass_before, "pass_at_1_after": pass_after, "reward_per_step": rewards,
              "threads": a.threads, "load_average": os.getloadavg()[0]}
    if a.save_policy:
        trainer.model.save_pretrained(a.save_policy, safe_serialization=True)
        tokenizer.save_pretrained(a.save_policy)
    _write_json(a.out, result)


def _write_json(path: str, data: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def evaluate_folder(folder: str, eval_file: Path, new_tokens: int, threads: int) -> float:
    """Greedy pass@1 of the HF model in `folder` (float32 `model.generate`, its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return greedy_pass_at_1(model, AutoTokenizer.from_pretrained(folder), _rows(eval_file), new_tokens, _grader())


if __name__ == "__main__":
    main()
