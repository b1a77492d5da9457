#!/usr/bin/env bash
# A GPU session's measurements (issues 23, 34, 46), sized for one lent device's 15 minutes, in parts
# (issue 46's priority order; `python bench/gpu_parts.py --plan` packs the owed ones into calls):
#   profile      bench/gpu_recorder_cost.py --profile at T = 2048: the recorded step's CUDA kernels
#                (the fused kernel vs the reductions vs idle), part A only
#   timing       alone on the GPU: bench/gpu_fused_attention.py (fused vs flash SDPA, statistics on/off,
#                T = 2048 / 4096 / 8192), bench/gpu_recorder_cost.py (the cheap tier on every step,
#                compiled, at GPT-2 small's shape, T = 2048 / 8192), gpu_check throughput (ARMS,
#                recording off and every 50, vs the nanoGPT-style reference)
#   wind-tunnel  dyntool sim bijection --device cuda for WT_MIN minutes per call, each run of WT_RUNS
#                ("PRESET:SEED ...", default "paper:42 authors:42", all at once) continued with --resume
#                from the furthest checkpoint of its chain in WT_DIR, so 100k steps span calls
#   span         dyntool study span --preset gpu with SPAN_ARMS (default the five arms: baseline, span,
#                c1a-a0.5, ab2, c1b-a2; 3 seeds)
#   ls-logits    dyntool study ls-logits --preset gpu (T = 512, 1024, 2048), the cheap tier every step
#   presets      the gpu presets of wikitext_ls and wikitext_qknorm, two at once (so not timed)
#   tests        pytest tests/gpu: recording on CUDA equals recording on the CPU (dense and streamed),
#                the fused kernel in fp32 / bf16 against float64, compiled and sync-checked recorded
#                steps, the wind tunnel's CUDA-graph step against the eager one and its resume
#   auto         the parts bench/gpu_parts.py says no committed bench/gpu_*.json has measured, then tests
#   bench/gpu_session.sh auto                  # or name parts: bench/gpu_session.sh profile timing
#   bench/gpu_session.sh bg:wind-tunnel timing # bg: runs a part beside the next ones
#   DRY_RUN=1 bench/gpu_session.sh auto        # print every command a part would run; run nothing
# A part named bg:NAME starts in the background and the script waits for it at the end; the runs'
# parts share the GPU that way (their times are then not measurements).  timing and profile are
# never bg: (they are timed alone).  bg:tests: a failing test then does not turn recording off for the
# runs beside it.  Every part's time limit is cut to what is left of DEADLINE (seconds after the start,
# default 560, for a 600 s call), and the results are packed into $OUT/results.tgz after each part and
# on exit, also when a limit or a signal ends it.  Each command is a line of $OUT/parts.jsonl (part,
# command, limit, exit code, seconds, COMMIT) and the hardware is $OUT/hardware.txt: `python
# bench/gpu_parts.py --skeleton $OUT` turns them into bench/gpu_<date>.json (every key null with
# its reason until the session fills it in; --check says what it must hold).
# Env: OUT (default ./gpu_out), COMMIT (the commit the working tree is at: the device copy has no .git),
# WIKITEXT (WikiText-2 folder), WHEELS (wheels the device lacks: zarr and its needs), DEADLINE,
# TS_S (the tests' limit, default 90), TEST_ARGS (more pytest arguments, e.g. -n 8), FU_S / RC_S / TP_S
# (the timing part's three limits, default 60 / 240 / 120), PF_S (profile's, default 150), RC_ARGS (more
# gpu_recorder_cost arguments, default --no-eager), ARMS (gpu_check's, default mhsa), RUN_S (a run's
# limit in presets / span / ls-logits, default 450), WT_MIN (the wind tunnel's minutes per call, default
# 7), WT_RUNS, WT_DIR (where its runs live between calls: default ./.gpu_runs, git-ignored; carry it to
# a fresh machine), WT_DEVICE (default cuda; cpu: the part's CPU test), WT_ARGS (more sim arguments),
# TESTS (the test paths, default tests/gpu), TIMING (the timing part's steps, default "fused recorder
# throughput"; "tune": bench/gpu_kernel_tune.py, limit TU_S, default 240), SPAN_SEEDS
# (e.g. "0 1 2": one span study per seed, all at once), SPAN_ARMS, SPAN_ARGS (more study arguments,
# e.g. --max-steps 125 for about one epoch), LS_PRESETS (e.g. "gpu512 gpu1024 gpu2048": one ls-logits
# study per length, at once; default gpu) and LS_ARGS, PRESETS (default "ls qknorm"), DRY_RUN=1.
set -u
PARTS="profile timing wind-tunnel span ls-logits presets tests"
usage() {
  echo "usage: bench/gpu_session.sh auto | [profile] [timing] [[bg:]wind-tunnel] [[bg:]span] [[bg:]ls-logits]" \
       "[[bg:]presets] [[bg:]tests]${1:+  ($1)}" >&2
  exit 2
}
parts=("$@")                                 # every name checked before anything starts
[ "${parts[*]}" = auto ] && read -r -a parts <<< "$(python3 bench/gpu_parts.py)"
[ ${#parts[@]} -gt 0 ] || usage "no part named"
for part in "${parts[@]}"; do
  case "$part" in
    bg:timing|bg:profile) usage "${part#bg:} is timed alone: never bg:" ;;
    bg:*) [[ " $PARTS " == *" ${part#bg:} "* ]] || usage "unknown part $part" ;;
    *) [[ " $PARTS " == *" $part "* ]] || usage "unknown part $part" ;;
  esac
done
for t in ${TIMING:-fused recorder throughput}; do
  case $t in fused|recorder|throughput|tune) ;; *) usage "TIMING: unknown step $t (fused, recorder, throughput, tune)" ;; esac
done
DRY=${DRY_RUN:-}
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu_work.XXXX)            # fresh on every call: run names never collide
DEADLINE=${DEADLINE:-560}
WIKITEXT=${WIKITEXT:-$PWD/.gpudata/wikitext-2}
WT_DIR=${WT_DIR:-$PWD/.gpu_runs}
export PYTHONUNBUFFERED=1 DYNTOOL_WIKITEXT="$WIKITEXT"
pack() {                                     # to a temporary name first: background parts pack too
  [ -n "$DRY" ] && return
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
# one line of $OUT/parts.jsonl per command: what ran, under which limit, how it ended
note() {                                     # note PART NAME LIMIT RC SECONDS CMD...
  local part=$1 name=$2 limit=$3 rc=$4 secs=$5; shift 5
  python3 - "$part" "$name" "$limit" "$rc" "$secs" "${COMMIT:-}" "$*" >> "$OUT/parts.jsonl" <<'EOF'
import json, sys
part, name, limit, rc, secs, commit, cmd = sys.argv[1:]
print(json.dumps({"part": part, "name": name, "limit_s": int(limit), "rc": None if rc == "" else int(rc),
                  "seconds": None if secs == "" else int(secs), "commit": commit, "command": cmd}))
EOF
}
# launch PART NAME LIMIT CMD...: run CMD under its limit, output to $W/NAME.log (never through a pipe: a
# killed python's compile workers can hold a pipe open past the limit); DRY_RUN=1 prints it instead
launch() {
  local part=$1 name=$2 limit=$3 t0=$SECONDS rc; shift 3
  if [ -n "$DRY" ]; then
    echo "dry-run: $name: $*"
    note "$part" "$name" "$limit" "" "" "$@"
    return 0
  fi
  timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
  rc=$?
  note "$part" "$name" "$limit" "$rc" "$(( SECONDS - t0 ))" "$@"
  return $rc
}
step() {                                     # step PART NAME LIMIT CMD...: launch, then show the log's end
  local part=$1 name=$2 rc; shift 2
  launch "$part" "$name" "$@"
  rc=$?
  [ -n "$DRY" ] && return 0
  echo "-- $name: exit $rc ($(date +%T))"; tail -n 25 "$W/$name.log"
  pack
}
if [ -z "$DRY" ]; then
  if [ -d "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
  python3 -c "import torch, zarr, dyntool" || exit 1
  { python3 -c "import torch, zarr; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', 'zarr', zarr.__version__)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1; nproc; } | tee "$OUT/hardware.txt"
fi
NO_REC=""                     # set when recording on CUDA fails its test: the runs then train unrecorded

part_tests() {
  # -o addopts= : one line per test (pyproject's -q would hide which ones a time limit cut off); the limit
  # sends SIGINT, so pytest still prints the failures' details it has (a SIGTERM lost them on 11-27)
  local limit; limit=$(left ${TS_S:-90})
  if [ -n "$DRY" ]; then launch tests pytest_gpu "$limit" python3 -m pytest ${TESTS:-tests/gpu}; return; fi
  timeout -s INT -k 20 "$limit" python3 -m pytest -p no:cacheprovider -o addopts= -v --durations=10 \
    ${TEST_ARGS:-} ${TESTS:-tests/gpu} > $W/pytest_gpu.log 2>&1
  local rc=$?
  note tests pytest_gpu "$limit" "$rc" "" python3 -m pytest ${TESTS:-tests/gpu}
  grep -E "FAILED|ERROR|passed|failed" $W/pytest_gpu.log | tail -n 20
  [ $rc = 0 ] || NO_REC="--record.enabled=false"
  pack
}

part_profile() {                             # the recorded step's kernels at T = 2048 (issue 46, first)
  step profile recorder_profile "$(left ${PF_S:-150})" python3 bench/gpu_recorder_cost.py --reps 3 --steps 4 \
    --T 2048 --no-full --profile --data "$WIKITEXT" ${RC_ARGS:---no-eager} --json $W/recorder_profile.json
}

part_timing() {
  local t
  for t in ${TIMING:-fused recorder throughput}; do
    case $t in
      fused) step timing fused_attention "$(left ${FU_S:-60})" python3 bench/gpu_fused_attention.py \
               --json $W/fused_attention.json ;;
      recorder) step timing recorder_cost "$(left ${RC_S:-240})" python3 bench/gpu_recorder_cost.py --reps 5 \
               --steps 4 --data "$WIKITEXT" ${RC_ARGS:---no-eager} ${PROFILE:+--profile} --json $W/recorder_cost.json ;;
      # the kernel's tiles / warps / stages, each setting against flash SDPA (not in the default TIMING)
      tune) step timing kernel_tune "$(left ${TU_S:-240})" python3 bench/gpu_kernel_tune.py --json $W/kernel_tune.json ;;
      # 160 steps: three recorded steps (50, 100, 150) after the 20 of warm-up, not one
      throughput) step timing gpu_check_throughput "$(left ${TP_S:-120})" python3 bench/gpu_check.py \
               --only throughput --steps 160 --arms ${ARMS:-mhsa} --json $W/gpu_check_throughput.json ;;
    esac
  done
}

R=$W/runs; mkdir -p $R
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
common() { echo "--out $R --quiet --data.path=$WIKITEXT $NO_REC"; }

part_presets() {                             # two at once: tokens/s from these runs are not measurements
  local c limit pids=() last=$SECONDS; limit=$(left ${RUN_S:-450})
  for c in ${PRESETS:-ls qknorm}; do
    launch presets "preset_$c" "$limit" python3 -m dyntool train --config wikitext_$c --preset gpu --name $c $(common) &
    pids+=($!)
  done
  while [ -z "$DRY" ] && alive "${pids[@]}"; do
    sleep 3
    (( SECONDS - last < 30 )) && continue
    last=$SECONDS
    { date +%T; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      for f in $R/*/metrics.jsonl; do echo "$f $(tail -n 1 "$f" | cut -c1-90)"; done; } 2>&1 | tee -a $W/progress.log
  done
  wait "${pids[@]}"
  [ -n "$DRY" ] || for c in ${PRESETS:-ls qknorm}; do tail -n 3 "$W/preset_$c.log"; done
  pack
}

part_span() {                                # the arms that tell the span paper's readings apart
  local s pids=() arms="--arms ${SPAN_ARMS:-baseline,span,c1a-a0.5,ab2,c1b-a2}"
  if [ -z "${SPAN_SEEDS:-}" ]; then
    step span study_span "$(left ${RUN_S:-450})" python3 -m dyntool study span --preset gpu --name span $arms \
      ${SPAN_ARGS:-} $(common)
    return
  fi
  for s in $SPAN_SEEDS; do                   # one study per seed, all at once: each holds every arm of its seed
    step span study_span_s$s "$(left ${RUN_S:-450})" python3 -m dyntool study span --preset gpu --seeds $s \
      --name span-s$s $arms ${SPAN_ARGS:-} $(common) &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"   # its own: not a background part started before it
}

part_ls-logits() {                           # LS_PRESETS="gpu512 gpu1024 gpu2048": one study per T, at once
  local p pids=()
  for p in ${LS_PRESETS:-gpu}; do
    step ls-logits study_ls_logits_$p "$(left ${RUN_S:-450})" python3 -m dyntool study ls-logits --preset $p \
      --n-seeds 1 --name ls_logits_$p --record.enabled=true --record.every=0 --record.cheap_every=1 ${LS_ARGS:-} \
      $(common) &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
}

part_wind-tunnel() {                         # every run of WT_RUNS at once, each continued from its chain
  local spec preset seed chain from pids=() limit
  limit=$(left $(( ${WT_MIN:-7} * 60 + 60 )))
  [ -n "$DRY" ] || mkdir -p "$WT_DIR" "$W/wind_tunnel"
  for spec in ${WT_RUNS:-paper:42 authors:42}; do
    preset=${spec%%:*} seed=${spec##*:} chain="wt_${preset}_s${seed}"
    from=$(python3 bench/gpu_parts.py --resume-from "$WT_DIR" "$chain")     # read-only: also in a dry run
    if [ -n "$from" ]; then
      step wind-tunnel "${chain}_from_$(basename "$from")" "$limit" python3 -m dyntool sim bijection --resume "$from" \
        --time_limit_min=${WT_MIN:-7} --out "$WT_DIR" --quiet ${WT_ARGS:-} &
    elif ! ls -d "$WT_DIR/$chain" >/dev/null 2>&1; then
      step wind-tunnel "$chain" "$limit" python3 -m dyntool sim bijection --preset "$preset" --seed "$seed" \
        --device ${WT_DEVICE:-cuda} --time_limit_min=${WT_MIN:-7} --name "$chain" --out "$WT_DIR" --quiet ${WT_ARGS:-} &
    else
      echo "-- $chain: its chain in $WT_DIR is at its steps (or has no checkpoint): nothing to continue"
      continue
    fi
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
  [ -n "$DRY" ] || (cd "$WT_DIR" && find . -maxdepth 2 \( -name meta.json -o -name metrics.jsonl -o -name config.json \) \
    -exec cp --parents {} "$W/wind_tunnel/" \;)
  pack
}

echo "parts: ${parts[*]}"
for part in "${parts[@]}"; do
  name=${part#bg:}
  echo "== $part $(date +%T) (${SECONDS}s of ${DEADLINE}s)"
  if [ "$name" = "$part" ]; then "part_$name"; else "part_$name" & fi
done
wait                                         # the background parts
pack
[ -n "$DRY" ] || ls -la "$OUT"
