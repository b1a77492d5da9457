#!/usr/bin/env bash
# Regenerate the README gallery, gallery/*.png, from the toy head and the sticky-chain study with its controls:
#
#     scripts/gallery.sh
#
# 1. simulates what is missing under $RUNS (default runs/gallery, git-ignored):
#      dyntool sim toy           --config toy            -> $RUNS/toy/toy            (seconds)
#      dyntool sim sticky-markov --config sticky_markov --controls  -> $RUNS/sticky-markov/controls
#        (10 seeds x every arm x 1000 steps at T = 2000: ~35 minutes on 2 shared CPU cores; its sgd
#        and em runs at the README seeds equal the default study's; the controls figure needs the
#        control arms.  The committed PNGs are from that 10-seed study)
#    An incomplete run/study left by an interrupted earlier call is removed and redone.
# 2. draws every figure those runs support as small PNGs (dpi $DPI, default 110) and copies only
#    the PNGs into $OUT (default gallery/); data files and captions are dropped (run
#    `dyntool figures RUN... --out DIR` for the full set: PDF/PNG/SVG + CSV/JSON + caption).
#    A PNG in $OUT is rewritten only when its decoded pixels differ (so the tree stays clean).
#
# Env: RUNS, OUT, DPI, PYTHON.  Figures alone (runs present) take well under a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RUNS=${RUNS:-runs/gallery}
OUT=${OUT:-gallery}
DPI=${DPI:-110}
dt() { "$PY" -m dyntool "$@"; }

mkdir -p "$RUNS"
inputs=()

# -- toy head (arXiv 2512.22473, toy attention-head simulation) ----------------------------------------------------------------------
toy="$RUNS/toy/toy"
if [ -d "$toy" ] && ! grep -q '"status": "finished"' "$toy/meta.json" 2>/dev/null; then
    echo "gallery: removing incomplete $toy"; rm -rf "$toy"
fi
if [ ! -d "$toy" ]; then
    echo "gallery: simulating the toy head -> $toy"
    dt sim toy --config toy --out "$RUNS/toy" --name toy
fi
inputs+=("$toy")

# -- sticky Markov chain (arXiv 2512.22473, sticky Markov-chain task); guarded: needs `dyntool sim sticky-markov` ------------------
sticky="$RUNS/sticky-markov/controls"
if dt sim sticky-markov --help >/dev/null 2>&1; then
    if [ -d "$sticky" ] && [ ! -f "$sticky/summary.json" ]; then
        echo "gallery: removing incomplete $sticky"; rm -rf "$sticky"
    fi
    if [ ! -d "$sticky" ]; then
        echo "gallery: simulating the sticky-chain study with its learning-rate controls -> $sticky (~35 minutes)"
        dt sim sticky-markov --config sticky_markov --controls --out "$RUNS/sticky-markov" --name controls --quiet
    fi
    inputs+=("$sticky")
else
    echo "gallery: 'dyntool sim sticky-markov' is not available; sticky-chain figures skipped"
fi

# -- figures -----------------------------------------------------------------------------------
build="$OUT/.build"
rm -rf "$build"
dt figures "${inputs[@]}" --out "$build" --format png --dpi "$DPI"
mkdir -p "$OUT"
# copy a PNG only when its decoded pixels changed (byte-level differences from the encoder alone
# would dirty the tracked gallery/ for nothing); drop PNGs that are no longer produced
"$PY" scripts/png_sync.py "$build" "$OUT"
rm -rf "$build"
echo "gallery: $(ls "$OUT"/*.png | wc -l) PNGs in $OUT/"
