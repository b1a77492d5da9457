#!/usr/bin/env bash
# The main job (README): install what is needed, then run the sticky Markov-chain study
# (5 seeds × SGD/EM-like, T = 2000, 1000 steps, recorded) into runs/sticky-markov/default.
# Progress: a bar on a terminal; when the output goes to a file or pipe, one line every
# $DYNTOOL_PROGRESS_SECONDS seconds (default 30) with steps done, rate, elapsed and ETA.
# Env: PYTHON (default python3), the interpreter setup.sh installed into; dyntool runs as
# `$PYTHON -m dyntool` so a scripts folder missing from PATH doesn't matter.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
./scripts/setup.sh
echo "main: sticky Markov-chain study (5 seeds x 2 arms, T = 2000, 1000 steps); several minutes on 2 cores"
study=runs/sticky-markov/default
if [ -e "$study/summary.json" ]; then
  echo "main: $study exists; writing a new study next to it"
  exec "$PY" -m dyntool sim sticky-markov "$@"
elif [ -e "$study" ]; then
  # an interrupted study (Ctrl-C) keeps its runs, marked 'interrupted'; never overwrite them
  echo "main: $study is incomplete (interrupted?); writing a new study next to it (rm -r $study to redo it under that name)"
  exec "$PY" -m dyntool sim sticky-markov "$@"
fi
exec "$PY" -m dyntool sim sticky-markov --name default "$@"
