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
name=(--name default)
if [ -e "$study/summary.json" ]; then
  echo "main: $study exists; writing a new study next to it"
  name=()
elif [ -e "$study" ]; then
  # an interrupted study (Ctrl-C) keeps its runs, marked 'interrupted'; never overwrite them
  echo "main: $study is incomplete (interrupted?); writing a new study next to it (rm -r $study to redo it under that name)"
  name=()
fi
"$PY" -m dyntool sim sticky-markov "${name[@]}" "$@"
# the study just written: the newest folder with a summary.json
made=$(ls -td runs/sticky-markov/*/summary.json 2>/dev/null | head -n 1 | xargs -r dirname)
# `dyntool` only if the one on PATH is this interpreter's (another install's would read other code)
bindir=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
dt="$PY -m dyntool"; [ "$(command -v dyntool 2>/dev/null)" = "$bindir/dyntool" ] && dt="dyntool"
echo
echo "main: done. Look at what it made:"
echo "  $dt ls runs/sticky-markov                 # table of its runs"
echo "  $dt info ${made:-$study}    # the study: summary and runs"
echo "  $dt app runs                              # browse them (Streamlit, localhost)"
