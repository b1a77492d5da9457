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
start=$SECONDS
LOG=$(mktemp "${TMPDIR:-/tmp}/dyntool-setup.XXXXXX")

# pip's own output is pages long (a line per requirement, download bars), and `pip -q` is minutes of
# nothing: pip's output goes to $LOG and this filter prints a line of ours per stage, every 10
# packages while it resolves and downloads, and pip's errors as they come.
progress() {
  local n=0 line first name rest words
  while IFS= read -r line; do
    case $line in
      "Collecting "*)
        n=$((n + 1)); read -r first name rest <<< "$line"
        if (( n % 10 == 1 )); then say "resolving and downloading: package $n ($name)"; fi ;;
      "Installing collected packages:"*)
        read -r -a words <<< "${line#*:}"; say "installing ${#words[@]} packages" ;;
      "Successfully installed"*)
        read -r -a words <<< "$line"; say "installed $(( ${#words[@]} - 2 )) packages" ;;
      ERROR*|error:*) echo "$line" ;;
    esac
  done
}
say() { echo "setup:   $1 ($((SECONDS - start)) s)"; }
pip_install() {
  if ! PYTHONUNBUFFERED=1 "$PY" -m pip install --progress-bar off "$@" 2>&1 | tee -a "$LOG" | progress; then
    echo "setup: pip failed; its last lines (all of it in $LOG):" >&2
    tail -n 15 "$LOG" >&2
    exit 1
  fi
}

# find_spec and the installed metadata answer without importing torch (seconds on a loaded machine)
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  echo "setup: [1/2] no torch in $PY; installing torch==2.13.0 (about 200 MB for the CPU wheel) ..."
  pip_install "torch==2.13.0"
else
  echo "setup: [1/2] torch is installed in $PY; it is kept"
fi
# the torch pin keeps pip from replacing the installed torch with another build while resolving
TORCH=$("$PY" -c "import importlib.metadata as m; print(m.version('torch').split('+')[0])")
echo "setup: [2/2] installing dyntool ${1:-core} ($TARGET) with torch $TORCH kept: 1-4 minutes in a fresh venv"
pip_install -e "$TARGET" "torch==$TORCH"
rm -f "$LOG"
echo "setup: done in $((SECONDS - start)) s"
