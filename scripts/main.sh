#!/usr/bin/env bash
# The main job (README): install what is needed, then run the sticky Markov-chain study
# (5 seeds × SGD/EM-like, T = 2000, 1000 steps, recorded) into runs/sticky-markov/default.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -e runs/sticky-markov/default/summary.json ]; then
  echo "runs/sticky-markov/default exists; writing a new study next to it"
  exec dyntool sim sticky-markov "$@"
fi
exec dyntool sim sticky-markov --name default "$@"
