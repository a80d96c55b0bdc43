#!/usr/bin/env bash
# Creates .venv-trl/: a separate virtualenv with TRL, for `make bench-trainer` (bench/trainer.py
# runs TRL's GRPOTrainer in it, side by side with our trainer). Not a dependency of the project,
# not used by CI.
set -euo pipefail
source "$(dirname "$0")/side_venv.sh"

VENV="${1:-.venv-trl}"
TRL_VERSION="1.16.0"
side_venv "$VENV" "" "trl==$TRL_VERSION" math-verify datasets accelerate

"$VENV/bin/python" - <<PYEOF
import torch, trl
assert torch.__version__.startswith("$TORCH_VERSION") and "+cpu" in torch.__version__, torch.__version__
print(f"trl {trl.__version__}, torch {torch.__version__}")
PYEOF
