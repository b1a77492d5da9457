#!/usr/bin/env bash
# Install dyntool and its dependencies into the current Python (or a venv you activated).
#
#     scripts/setup.sh          # the core: what the main job, the app and the figures need
#     scripts/setup.sh all      # + every extra the tests exercise (test, hf, tl, lightning, export, data,
#                               #   tensorboard: transformers, TransformerLens, Lightning, xarray, ...)
#
# On machines that carry the CPU torch wheel, torch==2.13.0 is taken from it (no CUDA download);
# pyproject's own torch range stays open for GPU users.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "${1:-core}" in
  core) TARGET="." ;;
  all)  TARGET=".[test,hf,tl,lightning,export,tensorboard,data,scale]" ;;
  *)    echo "setup.sh: unknown argument '$1' (use 'core' or 'all')" >&2; exit 2 ;;
esac
# pip runs quietly (its resolver output is pages long); these lines say what it is doing meanwhile
start=$SECONDS
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch in $PY; installing torch==2.13.0 (about 200 MB for the CPU wheel) ..."
  "$PY" -m pip install -q "torch==2.13.0"
fi
# the torch pin keeps pip from replacing the installed torch with another build while resolving
TORCH=$("$PY" -W ignore -c "import torch; print(torch.__version__.split('+')[0])")
echo "setup: installing dyntool ${1:-core} ($TARGET) with torch $TORCH kept, into $PY; pip is quiet:" \
     "1-4 minutes in a fresh venv ..."
"$PY" -m pip install -q -e "$TARGET" "torch==$TORCH"
echo "setup: done in $((SECONDS - start)) s"
