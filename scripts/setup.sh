#!/usr/bin/env bash
# Install dyntool and its dependencies into the current Python (or a venv you activated).
# On machines that carry the CPU torch wheel, torch==2.13.0 is taken from it (no CUDA download);
# pyproject's own torch range stays open for GPU users.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
# the adapter extras (hf, tl, lightning) so the adapter tests run; the torch pin keeps pip from
# replacing the installed torch with another build while resolving them
TORCH=$("$PY" -W ignore -c "import torch; print(torch.__version__.split('+')[0])")
"$PY" -m pip install -q -e ".[test,hf,tl,lightning,export,tensorboard]" "torch==$TORCH"
