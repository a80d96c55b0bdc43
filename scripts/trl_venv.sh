#!/usr/bin/env bash
# Creates .venv-trl/: a separate virtualenv with TRL, for `make bench-trainer` (bench/trainer.py
# runs TRL's GRPOTrainer in it, side by side with our trainer). Not a dependency of the project,
# not used by CI.
#
# torch 2.13.0 (the CPU build on local disk) goes in first and is pinned by a constraints file,
# so resolving trl never swaps in a CUDA build.
set -euo pipefail

VENV="${1:-.venv-trl}"
PY="$VENV/bin/python"
TRL_VERSION="1.16.0"
TORCH_VERSION="2.13.0"

python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==$TORCH_VERSION"

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" > "$constraints"
PIP_CONSTRAINT="$constraints" "$PY" -m pip install -q "trl==$TRL_VERSION" math-verify datasets accelerate

"$PY" - <<PYEOF
import torch, trl
assert torch.__version__.startswith("$TORCH_VERSION") and "+cpu" in torch.__version__, torch.__version__
print(f"trl {trl.__version__}, torch {torch.__version__}")
PYEOF
