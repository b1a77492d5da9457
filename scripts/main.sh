#!/usr/bin/env bash
# The main job (README): install what is needed, then run the sticky Markov-chain study
# (5 seeds × SGD/EM-like, T = 2000, 1000 steps, recorded) into runs/sticky-markov/default.
# Progress: a bar on a terminal; when the output goes to a file or pipe, one line every
# $DYNTOOL_PROGRESS_SECONDS seconds (default 30) with steps done, rate, elapsed and ETA.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
./scripts/setup.sh
echo "main: sticky Markov-chain study (5 seeds x 2 arms, T = 2000, 1000 steps); several minutes on 2 cores"
if [ -e runs/sticky-markov/default/summary.json ]; then
  echo "runs/sticky-markov/default exists; writing a new study next to it"
  exec dyntool sim sticky-markov "$@"
fi
exec dyntool sim sticky-markov --name default "$@"
