#!/usr/bin/env bash
# A GPU session's measurements (issues 23, 34), sized for one lent device's 15 minutes, in parts:
#   tests        pytest tests/gpu: recording on CUDA equals recording on the CPU (dense and streamed),
#                the fused kernel in fp32 / bf16 against float64, compiled and sync-checked recorded steps
#   timing       alone on the GPU: bench/gpu_fused_attention.py (fused vs flash SDPA, statistics on/off,
#                T = 2048 / 4096 / 8192), bench/gpu_recorder_cost.py (the cheap tier on every step,
#                compiled, at GPT-2 small's shape, T = 2048 / 8192), gpu_check throughput (ARMS,
#                recording off and every 50, vs the nanoGPT-style reference)
#   presets      the gpu presets of wikitext_ls and wikitext_qknorm, two at once (so not timed)
#   span         dyntool study span --preset gpu (3 seeds, baseline and span arms)
#   ls-logits    dyntool study ls-logits --preset gpu (T = 512, 1024, 2048), the cheap tier every step
#   wind-tunnel  dyntool sim bijection --preset paper --device cuda, stopped at WT_MIN minutes
#   auto         tests, then the parts bench/gpu_parts.py says no committed bench/gpu_*.json has measured
#   bench/gpu_session.sh auto                  # or name parts: bench/gpu_session.sh tests timing
#   bench/gpu_session.sh tests timing bg:presets bg:wind-tunnel   # bg: runs a part beside the next ones
# A part named bg:NAME starts in the background and the script waits for it at the end; the runs'
# parts share the GPU that way (their times are then not measurements).  timing is never bg: (it is
# timed alone).  bg:tests: a failing test then does not turn recording off for the runs beside it.
# Every part's time limit is cut to what is left of DEADLINE (seconds after the start, default 560,
# for a 600 s call), and the results are packed into $OUT/results.tgz after each part and on exit,
# also when a limit or a signal ends it.  A session then writes bench/gpu_<date>.json (gpu_parts.py
# --check says what it must hold).
# Env: OUT (default ./gpu_out), WIKITEXT (WikiText-2 folder), WHEELS (wheels the device lacks: zarr
# and its needs), DEADLINE, TS_S (the tests' limit, default 90), TEST_ARGS (more pytest arguments,
# e.g. -n 8: pytest-xdist is in the device image), FU_S / RC_S / TP_S (the timing part's three limits,
# default 60 / 240 / 120), RC_ARGS (more gpu_recorder_cost arguments, default --no-eager), ARMS
# (gpu_check's, default mhsa), RUN_S (a run's limit in presets / span / ls-logits, default 450),
# WT_MIN (the wind tunnel's minutes, default 7), PROFILE=1 (kernel table of the cheap tier), TESTS (the
# test paths, default tests/gpu), TIMING (the timing part's steps, default "fused recorder throughput";
# "tune": bench/gpu_kernel_tune.py, the kernel's settings against flash SDPA, limit TU_S, default 240),
# SPAN_SEEDS (e.g. "0 1 2": one span study per seed, all at once, instead of one study of seeds 0-2)
# and SPAN_ARGS (more study arguments, e.g. --max-steps 1000), LS_PRESETS (e.g. "gpu512 gpu1024
# gpu2048": one ls-logits study per length, at once; default gpu, the whole sweep in one) and LS_ARGS
# (e.g. "--arms mhsa,ls --max-steps 1500"), PRESETS (the presets part's configs, default "ls qknorm").
set -u
usage() {
  echo "usage: bench/gpu_session.sh auto | [[bg:]tests] [timing] [[bg:]presets] [[bg:]span] [[bg:]ls-logits]" \
       "[[bg:]wind-tunnel]${1:+  ($1)}" >&2
  exit 2
}
parts=("$@")                                 # every name checked before anything starts
[ "${parts[*]}" = auto ] && read -r -a parts <<< "$(python3 bench/gpu_parts.py)"
[ ${#parts[@]} -gt 0 ] || usage "no part named"
for part in "${parts[@]}"; do
  case "$part" in
    tests|timing|presets|span|ls-logits|wind-tunnel|bg:tests|bg:presets|bg:span|bg:ls-logits|bg:wind-tunnel) ;;
    bg:timing) usage "timing is timed alone: never bg:" ;;
    *) usage "unknown part $part" ;;
  esac
done
for t in ${TIMING:-fused recorder throughput}; do
  case $t in fused|recorder|throughput|tune) ;; *) usage "TIMING: unknown step $t (fused, recorder, throughput, tune)" ;; esac
done
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu_work.XXXX)            # fresh on every call: run names never collide
DEADLINE=${DEADLINE:-560}
WIKITEXT=${WIKITEXT:-$PWD/.gpudata/wikitext-2}
export PYTHONUNBUFFERED=1 DYNTOOL_WIKITEXT="$WIKITEXT"
pack() {                                     # to a temporary name first: background parts pack too
  tar czf "$OUT/.results.$BASHPID.tgz" -C "$W" --exclude='*.zarr' --exclude='*.pt' . 2>/dev/null
  mv -f "$OUT/.results.$BASHPID.tgz" "$OUT/results.tgz"
}
trap pack EXIT
trap 'pack; exit 143' TERM INT
left() {                                     # a part's limit: its default, or what the deadline leaves
  local want=$1 rest=$(( DEADLINE - SECONDS - 20 ))
  (( rest < 10 )) && rest=10
  echo $(( want < rest ? want : rest ))
}
if [ -d "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 -c "import torch, zarr, dyntool; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0), 'zarr', zarr.__version__)" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
NO_REC=""                     # set when recording on CUDA fails its test: the runs then train unrecorded

part_tests() {
  # -o addopts= : one line per test (pyproject's -q would hide which ones a time limit cut off); the limit
  # sends SIGINT, so pytest still prints the failures' details it has (a SIGTERM lost them on 11-27)
  timeout -s INT -k 20 "$(left ${TS_S:-90})" python3 -m pytest -p no:cacheprovider -o addopts= -v --durations=10 \
    ${TEST_ARGS:-} ${TESTS:-tests/gpu} > $W/pytest_gpu.log 2>&1
  local rc=$?
  grep -E "FAILED|ERROR|passed|failed" $W/pytest_gpu.log | tail -n 20
  [ $rc = 0 ] || NO_REC="--record.enabled=false"
  pack
}

# a step's output goes to a file, never through a pipe: a killed python's compile workers can hold a
# pipe open past the limit (tee then waits, and the call overruns)
step() {                                     # step NAME LIMIT CMD...: run, then show the log's end
  local name=$1 limit=$2; shift 2
  timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
  echo "-- $name: exit $? ($(date +%T))"; tail -n 25 "$W/$name.log"
  pack
}

part_timing() {
  local t
  for t in ${TIMING:-fused recorder throughput}; do
    case $t in
      fused) step fused_attention "$(left ${FU_S:-60})" python3 bench/gpu_fused_attention.py \
               --json $W/fused_attention.json ;;
      recorder) step recorder_cost "$(left ${RC_S:-240})" python3 bench/gpu_recorder_cost.py --reps 5 --steps 4 \
               --data "$WIKITEXT" ${RC_ARGS:---no-eager} ${PROFILE:+--profile} --json $W/recorder_cost.json ;;
      # the kernel's tiles / warps / stages, each setting against flash SDPA (not in the default TIMING)
      tune) step kernel_tune "$(left ${TU_S:-240})" python3 bench/gpu_kernel_tune.py --json $W/kernel_tune.json ;;
      # 160 steps: three recorded steps (50, 100, 150) after the 20 of warm-up, not one
      throughput) step gpu_check_throughput "$(left ${TP_S:-120})" python3 bench/gpu_check.py --only throughput \
               --steps 160 --arms ${ARMS:-mhsa} --json $W/gpu_check_throughput.json ;;
    esac
  done
}

R=$W/runs; mkdir -p $R
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
common() { echo "--out $R --quiet --data.path=$WIKITEXT $NO_REC"; }

part_presets() {                             # two at once: tokens/s from these runs are not measurements
  local c limit pids=() last=$SECONDS; limit=$(left ${RUN_S:-450})
  for c in ${PRESETS:-ls qknorm}; do
    timeout -k 10 "$limit" python3 -m dyntool train --config wikitext_$c --preset gpu --name $c $(common) \
      > "$R/$c.log" 2>&1 &
    pids+=($!)
  done
  while alive "${pids[@]}"; do
    sleep 3
    (( SECONDS - last < 30 )) && continue
    last=$SECONDS
    { date +%T; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      for f in $R/*/metrics.jsonl; do echo "$f $(tail -n 1 "$f" | cut -c1-90)"; done; } 2>&1 | tee -a $W/progress.log
  done
  for c in ${PRESETS:-ls qknorm}; do tail -n 3 "$R/$c.log"; done; pack
}

part_span() {
  local s pids=()
  if [ -z "${SPAN_SEEDS:-}" ]; then
    step study_span "$(left ${RUN_S:-450})" python3 -m dyntool study span --preset gpu --name span ${SPAN_ARGS:-} $(common)
    return
  fi
  for s in $SPAN_SEEDS; do                   # one study per seed, all at once: each holds both arms of its seed
    step study_span_s$s "$(left ${RUN_S:-450})" python3 -m dyntool study span --preset gpu --seeds $s \
      --name span-s$s ${SPAN_ARGS:-} $(common) &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"   # its own: not a background part started before it
}

part_ls-logits() {                           # LS_PRESETS="gpu512 gpu1024 gpu2048": one study per T, at once
  local p pids=()
  for p in ${LS_PRESETS:-gpu}; do
    step study_ls_logits_$p "$(left ${RUN_S:-450})" python3 -m dyntool study ls-logits --preset $p --n-seeds 1 \
      --name ls_logits_$p --record.enabled=true --record.every=0 --record.cheap_every=1 ${LS_ARGS:-} $(common) &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
}

part_wind-tunnel() {
  step wind_tunnel "$(left $(( ${WT_MIN:-7} * 60 + 60 )))" python3 -m dyntool sim bijection --preset paper \
    --device cuda --time_limit_min=${WT_MIN:-7} --name wind_tunnel --out $R --quiet
}

echo "parts: ${parts[*]}"
for part in "${parts[@]}"; do
  name=${part#bg:}
  echo "== $part $(date +%T) (${SECONDS}s of ${DEADLINE}s)"
  if [ "$name" = "$part" ]; then "part_$name"; else "part_$name" & fi
done
wait                                         # the background parts
pack
ls -la "$OUT"
