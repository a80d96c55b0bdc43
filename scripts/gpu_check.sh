#!/usr/bin/env bash
# The GPU paths end to end, for whoever gets a machine with a GPU (issue 29): the hf engine on
# CUDA, the trainer on CUDA in this process, then 2 torch.distributed workers on NCCL (FSDP2 and
# DDP) where there are 2 GPUs (3 with the engine on a GPU of its own), each a shortened
# `experiment=learn`, plus the 2-workers-vs-1 equality test on CUDA. Prints a pass/fail table;
# exits 1 when a row failed. On a machine without a GPU every row says "no GPU: skipped" and it
# exits 0 (the CPU paths are the test suite's).
#   bash scripts/gpu_check.sh            (uses .venv, made by `make venv`)
#   PY=/path/to/python bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${GPU_CHECK_DIR:-$(mktemp -d -t gpu_check.XXXXXX)}
# seconds per row
LIMIT=${GPU_CHECK_LIMIT:-420}
export WANDB_MODE=offline WANDB_SILENT=true HYDRA_FULL_ERROR=1 RAY_AUTH_MODE=disabled

if [ ! -x "$PY" ]; then
  echo "gpu_check: no python at $PY (run 'make venv' or set PY=)" >&2
  exit 2
fi
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
ROWS=()
FAILED=0

row() {  # row <name> <GPUs needed> <command...>
  local name=$1 need=$2
  shift 2
  if [ "$GPUS" -eq 0 ]; then
    ROWS+=("| $name | no GPU: skipped | |")
    return
  fi
  if [ "$GPUS" -lt "$need" ]; then
    ROWS+=("| $name | skipped: needs $need GPUs, this machine has $GPUS | |")
    return
  fi
  local log="$OUT/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').log" start=$SECONDS
  if timeout "$LIMIT" "$@" >"$log" 2>&1; then
    ROWS+=("| $name | pass | $((SECONDS - start)) s |")
  else
    ROWS+=("| $name | FAIL (exit $?, log $log) | $((SECONDS - start)) s |")
    FAILED=1
  fi
}

# a learn run cut to 3 rollouts with one eval and one checkpoint, then its resume
LEARN=(run.py experiment=learn num_rollout=3 eval_interval=2 save_interval=2 logger=jsonl rollout.progress=false)

row "hf engine on cuda (3 rollouts)" 1 \
  "$PY" run.py engine.device=cuda num_rollout=3 "hydra.run.dir=$OUT/engine"
row "in-process trainer + engine on cuda:0 (learn, shortened)" 1 \
  "$PY" "${LEARN[@]}" engine.device=cuda engine.colocate=true trainer.device=cuda "hydra.run.dir=$OUT/one"
row "resume of that run (2 more rollouts)" 1 \
  "$PY" run.py "resume=$OUT/one" num_rollout=5
row "2 workers fsdp2 gloo on cpu, engine on cuda" 1 \
  "$PY" "${LEARN[@]}" engine.device=cuda trainer.num_workers=2 trainer.device=cpu trainer.num_threads=1 \
  "hydra.run.dir=$OUT/cpu_workers"
row "2 workers fsdp2 nccl, engine on cuda:0 with worker 0" 2 \
  "$PY" "${LEARN[@]}" engine.device=cuda engine.colocate=true trainer.num_workers=2 trainer.device=cuda \
  "hydra.run.dir=$OUT/fsdp2"
row "2 workers ddp nccl, engine on a GPU of its own" 3 \
  "$PY" "${LEARN[@]}" engine.device=cuda engine.colocate=false trainer.num_workers=2 trainer.strategy=ddp \
  trainer.device=cuda "hydra.run.dir=$OUT/ddp"
row "2 workers fsdp2 bf16 autocast + LoRA on cuda" 2 \
  "$PY" "${LEARN[@]}" engine.device=cuda engine.colocate=true trainer.num_workers=2 trainer.device=cuda \
  trainer.bf16=true trainer.lora_rank=8 trainer.lr=1e-4 "hydra.run.dir=$OUT/lora"
row "equality: 2 cuda workers vs 1 (pytest)" 2 \
  env TRAINER_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider tests/train/test_distributed_trainer.py \
  -k make_the_one_process_update

echo
echo "GPU check ($GPUS GPU(s); logs in $OUT)"
echo "| check | result | time |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
