# Sourced by scripts/vllm_venv.sh and scripts/trl_venv.sh: a separate virtualenv with torch
# 2.13.0 (the CPU build on local disk) installed first and pinned by a constraints file, so that
# resolving the other packages never swaps in a CUDA build.
#   side_venv <venv> <extra constraint lines> <package>...
TORCH_VERSION="2.13.0"

side_venv() {
  local venv="$1" extra="$2"
  shift 2
  local py="$venv/bin/python" constraints
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==$TORCH_VERSION"
  constraints="$(mktemp)"
  printf 'torch==%s\n%s' "$TORCH_VERSION" "$extra" > "$constraints"
  PIP_CONSTRAINT="$constraints" "$py" -m pip install -q "$@"
  rm -f "$constraints"
}
