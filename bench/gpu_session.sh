#!/usr/bin/env bash
# A GPU session's measurements (issue 23), sized for one lent device's 15 minutes, in parts:
#   tests    pytest tests/gpu: recording on CUDA equals recording on the CPU (dense and streamed), the
#            fused kernel in bf16 against float64, a compiled and a sync-checked recorded step
#   fused    alone on the GPU: bench/gpu_fused_attention.py (issue 33's figures: fused vs flash SDPA
#            and statistics on/off at T = 2048 / 4096 / 8192, bf16 accuracy, fullgraph compile)
#   timing   alone on the GPU: the recorder's cost at GPT-2 small's shape (bench/gpu_recorder_cost.py),
#            then gpu_check throughput (ARMS, recording off and every 50, vs the nanoGPT-style reference)
#   runs     two at a time on the GPU (so untimed): the gpu presets of wikitext_mhsa + span, ls +
#            qknorm (3000 steps, or as far as RUN_S seconds allow), then ls_logits at T = 2048 (mhsa,
#            ls); gpu_check parity, graph_breaks and resume beside the first wave
#   bench/gpu_session.sh tests fused timing runs   # the parts in this order; results in $OUT/results.tgz
# Every part's time limit is cut to what is left of DEADLINE (seconds after the start, default 560,
# for a 600 s call), and the results are packed on exit, also when a limit or a signal ends it.
# Env: OUT (default ./gpu_out), WIKITEXT (WikiText-2 folder), WHEELS (wheels the device lacks: zarr
# and its needs), DEADLINE, RUN_S (seconds per run of "runs", default 150), TS_S (the tests' limit, default 90), TEST_ARGS
# (more pytest arguments, e.g. -n 8 where pytest-xdist is installed), TP_S / RC_S (limits of
# the two timed parts, default 200 / 200), FU_S (the fused part's, default 150), ARMS (default mhsa,ls,span), PROFILE=1 (kernel table of
# the cheap tier).
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu_work.XXXX)            # fresh on every call: run names never collide
DEADLINE=${DEADLINE:-560}
WIKITEXT=${WIKITEXT:-$PWD/.gpudata/wikitext-2}
export PYTHONUNBUFFERED=1 DYNTOOL_WIKITEXT="$WIKITEXT"
pack() { tar czf "$OUT/results.tgz" -C "$W" --exclude='*.zarr' --exclude='*.pt' . 2>/dev/null; }
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
  # -o addopts= : one line per test (pyproject's -q would hide which ones a time limit cut off)
  timeout "$(left ${TS_S:-90})" python3 -m pytest -p no:cacheprovider -o addopts= -v --durations=10 \
    ${TEST_ARGS:-} tests/gpu 2>&1 | tee $W/pytest_gpu.log
  [ "${PIPESTATUS[0]}" = 0 ] || NO_REC="--record.enabled=false"
}

part_fused() {
  timeout "$(left ${FU_S:-150})" python3 bench/gpu_fused_attention.py --json $W/fused_attention.json \
    > $W/fused_attention.log 2>&1
  [ -f $W/fused_attention.json ] && cat $W/fused_attention.json || tail -n 20 $W/fused_attention.log
  pack
}

part_timing() {
  # the recorder's cost first (the fused cheap tier, compiled: never measured), then gpu_check's throughput
  timeout "$(left ${RC_S:-200})" python3 bench/gpu_recorder_cost.py --reps 5 --steps 4 --data "$WIKITEXT" \
    ${PROFILE:+--profile} --json $W/recorder_cost.json > $W/recorder_cost.log 2>&1
  [ -f $W/recorder_cost.json ] && cat $W/recorder_cost.json || tail -n 20 $W/recorder_cost.log
  pack
  # 160 steps: three recorded steps (50, 100, 150) after the 20 of warm-up, not one
  timeout "$(left ${TP_S:-200})" python3 bench/gpu_check.py --only throughput --steps 160 \
    --arms ${ARMS:-mhsa,ls,span} --json $W/gpu_check_throughput.json 2>&1 | tee $W/gpu_check_throughput.log
  pack
}

part_runs() {
  # in three waves of two: seven processes at once ran out of the H100's 80 GB (span, ls, qknorm died)
  local R=$W/runs; mkdir -p $R
  local common="--out $R --quiet --data.path=$WIKITEXT $NO_REC"
  wave() {
    local limit; limit=$(left ${RUN_S:-150})
    for arg in "$@"; do
      local name=${arg%%:*} cmd=${arg#*:}
      timeout "$limit" python3 -m dyntool train $cmd --name $name $common > "$R/$name.log" 2>&1 &
    done
    local last=$SECONDS
    while [ -n "$(jobs -r)" ]; do
      sleep 3
      (( SECONDS - last < 30 )) && continue
      last=$SECONDS
      { date +%T; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
        for f in $R/*/metrics.jsonl; do echo "$f $(tail -n 1 "$f" | cut -c1-70)"; done; } 2>&1 | tee -a $W/progress.log
    done
    pack
  }
  timeout "$(left ${RUN_S:-150})" python3 bench/gpu_check.py --only parity,graph_breaks,resume \
    --json $W/gpu_check_rest.json > $W/gpu_check_rest.log 2>&1 &
  wave "mhsa:--config wikitext_mhsa --preset gpu" "span:--config wikitext_span --preset gpu"
  wave "ls:--config wikitext_ls --preset gpu" "qknorm:--config wikitext_qknorm --preset gpu"
  wave "ls_logits_mhsa:--config ls_logits --preset gpu2048 --model.attention=mhsa" \
       "ls_logits_ls:--config ls_logits --preset gpu2048 --model.attention=ls"
  tail -n 3 $R/*.log; tail -n 4 $W/gpu_check_rest.log
}

for part in "$@"; do
  case "$part" in
    tests|fused|timing|runs) echo "== $part $(date +%T) (${SECONDS}s of ${DEADLINE}s)"; part_$part ;;
    *) echo "usage: bench/gpu_session.sh [tests] [fused] [timing] [runs]" >&2; exit 2 ;;
  esac
done
ls -la "$OUT"
