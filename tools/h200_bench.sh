#!/bin/sh
# Runs one part of the H200 benchmarks: sh tools/h200_bench.sh PART OUTDIR
#
# Needs a machine where `python3 -m app` runs on MLX's CUDA backend (on the lent GPU machines,
# `source .gpu/setup.sh` first), started from the repository root (the script puts it on
# PYTHONPATH). The pairs are synthetic (`--synthetic`), built in memory: nothing is downloaded.
#
# PART: a name from the case statement below; each says which table of docs/benchmarks.md it
#   fills. `open` (plain steps within the spells) and `open2` (what the summary still lacks), one
#   device call each.
#   The parts behind earlier runs (docs/benchmarks-history.md names them) are in git's history.
# OUTDIR: created if missing. Each command writes OUTDIR/NAME.json (`tandem bench --json`; with
#   several miss rates, one file per rate) and OUTDIR/NAME.err (its stderr); some also NAME.txt
#   (what it printed). Copy the files the docs cite into docs/bench/.
# BUDGET: seconds for the parts that read it (a `timeout` on their commands).
set -u
part=$1
out=$2
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Cost profiles in OUTDIR: the GPU machine has only the engine's dependencies (no platformdirs).
tandem="python3 -m app --data-dir $out/data"
bench() {  # name, seconds, then bench arguments: one command, its table printed and kept
  name=$1
  seconds=$2
  shift 2
  echo "== $name: tandem bench --bits 4 --dtype bfloat16 --temps 0 $*"
  start=$(date +%s)
  timeout "$seconds" $tandem bench --bits 4 --dtype bfloat16 --temps 0 \
    --json "$out/$name.json" "$@" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
}
one() {  # name, pair, then bench arguments: one request, against plain decoding and mlx-lm
  name=$1
  pair=$2
  shift 2
  bench "$name" "${BUDGET:-590}" --synthetic "$pair" --impls plain,mlx-lm,tandem \
    --mlx-lm-ks 15 --max-tokens 192 --warmup 192 --repeats 2 "$@"
}
streams() {  # name, pair, then bench arguments: 4 and 8 requests at once, median of 3 runs
  name=$1
  pair=$2
  shift 2
  bench "$name" "${BUDGET:-590}" --synthetic "$pair" --concurrent 4,8 --miss 0,0.1 \
    --ks 15,auto --max-tokens 128 --fresh-shapes --repeats 3 "$@"
}
# The 27B's streams take about 550 s for both miss rates (estimated from run 39's): one call each.
hybrid="qwen3.6-27b:qwen3.5-0.8b"
spell() {  # name, environment, then bench arguments: run 39b's configurations, each reply's steps
  name=$1
  env=$2
  shift 2
  echo "== $name: $env tandem bench --synthetic $hybrid --miss 0.28 --ks 2,auto --impls plain,tandem $*"
  env $env timeout 140 $tandem bench --synthetic $hybrid --bits 4 --dtype bfloat16 \
    --miss 0.28 --ks 2,auto --impls plain,tandem --temps 0 --max-tokens 128 --warmup 32 \
    --repeats 3 --json "$out/$name.json" "$@" > "$out/$name.txt" 2> "$out/$name.err"
  python3 tools/round_spells.py "$out/$name.json"
}
case "$part" in
one-8b)  # "One request on the H200"
  one one-8b-1b 8b:1b --miss 0,0.1 --ks 15,auto,auto-uncut
  ;;
one-32b)
  one one-32b-0.5b 32b:0.5b --miss 0,0.1 --ks 13,15,auto
  ;;
one-70b)
  one one-70b-1b 70b:1b --miss 0,0.1,0.28 --ks 8,15,auto --max-tokens 128 --warmup 128
  ;;
streams-70b)  # "Several requests at once on the H200"
  streams streams-70b-1b 70b:1b
  ;;
streams-8b)
  streams streams-8b-1b 8b:1b
  ;;
hybrid)  # "Hybrid targets": the hybrid 27B with the 0.8B draft, one request
  bench one-qwen3.6-27b "${BUDGET:-250}" --synthetic $hybrid --miss 0.1,0.28 --ks 8,15,auto \
    --impls plain,tandem --max-tokens 128 --warmup 32 --repeats 2
  ;;
attention)  # the same beside an attention target of the hybrid's size
  bench one-27b-attention "${BUDGET:-250}" --synthetic 27b-attention:qwen3.5-0.8b \
    --miss 0.1,0.28 --ks 8,15,auto --impls plain,tandem --max-tokens 128 --warmup 32 --repeats 2
  ;;
hstreams)  # the hybrid 27B's streams at miss 0 (hstreams-0.1: at 0.1)
  streams streams-qwen3.6-27b $hybrid --miss 0
  ;;
hstreams-0.1)
  streams streams-qwen3.6-27b-miss0.1 $hybrid --miss 0.1
  ;;
mtp)  # "The target's own MTP head": depth 1-8 and Auto, then the 0.8B draft at miss 0.1
  bench one-27b-mtp "${BUDGET:-400}" --synthetic qwen3.6-27b:mtp --miss 0,0.1,0.28 \
    --ks 1,2,3,4,6,8,auto --impls plain,tandem --max-tokens 128 --warmup 32 --repeats 2
  bench one-27b-0.8b "${BUDGET:-170}" --synthetic $hybrid --miss 0.1 --ks 4,8,15,auto \
    --impls plain,tandem --max-tokens 128 --warmup 32 --repeats 2
  ;;
mtpstreams)  # the MTP head's streams at miss 0 (mtpstreams-0.1: at 0.1)
  streams streams-27b-mtp qwen3.6-27b:mtp --ks 4,auto --miss 0
  ;;
mtpstreams-0.1)
  streams streams-27b-mtp-miss0.1 qwen3.6-27b:mtp --ks 4,auto --miss 0.1
  ;;
spells)  # whether plain steps run in spells, by graph setting: run 39b's pair and configurations
  # (mlx-lm's plain loop, k = 2, Auto at miss 0.28), then each reply's steps (tools/round_spells.py)
  for env in "" "MLX_CUDA_GRAPH_CACHE_SIZE=400 MLX_MAX_OPS_PER_BUFFER=20" "MLX_USE_CUDA_GRAPHS=0"; do
    spell "spells-$(echo "${env:-app}" | tr ' =' '-_')" "$env"
  done
  ;;
spells-fresh)  # the same with the app's graphs, each reply's prompt new (no cache taken over)
  spell spells-fresh "" --fresh-shapes
  ;;
fresh)  # whether configurations of one process still spread with --fresh-shapes
  for shapes in replayed fresh; do
    flag=""; [ "$shapes" = fresh ] && flag=--fresh-shapes
    BUDGET=280 one "fresh-8b-1b-$shapes" 8b:1b --miss 0 --ks 15,auto,auto-uncut $flag
  done
  ;;
ttft)  # "Time to first token"
  bench ttft-70b-1b 300 --synthetic 70b:1b --miss 0 --ttft
  ;;
batch)  # one forward of 1-8 sequences x 1-16 rows, batched and packed
  for pair in 70b:1b 8b:1b; do
    bench "batch-${pair%%:*}" 280 --synthetic "$pair" --batch-profile
  done
  ;;
plainsteps)  # Tandem's plain steps and Auto's replies against mlx-lm's loop, within rounds
  timeout "${BUDGET:-500}" python3 tools/plain_step_probe.py qwen3.6-27b --bits 4 --dtype bfloat16 \
    --draft qwen3.5-0.8b --miss 0.28 --rounds 16 --tokens 64 | tee "$out/plainsteps.txt"
  ;;
open)  # one device call: the hybrid's plain steps and Auto at miss 0.28 within the spells
  sh "$0" plainsteps "$out"
  ;;
open2)  # a second call: whether configurations of one process still spread
  sh "$0" fresh "$out"
  ;;
*)
  echo "unknown part '$part' (see the case statement in $0)" >&2
  exit 2
  ;;
esac
