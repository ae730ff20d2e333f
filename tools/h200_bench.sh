#!/bin/sh
# Runs one part of the H200 benchmarks: sh tools/h200_bench.sh PART OUTDIR
#
# Needs a machine where `python3 -m app` runs on MLX's CUDA backend (on the lent GPU machines,
# `source .gpu/setup.sh` first), started from the repository root (the script puts it on
# PYTHONPATH). The pairs are synthetic (`--synthetic`), built in memory: nothing is downloaded.
#
# PART: a name from the case statement below, most with a comment saying what it measures; the
#   parts named rN (r15a, r28c, ...) are run N in docs/benchmarks-history.md.
# OUTDIR: created if missing. Each command writes OUTDIR/NAME.json (`tandem bench --json`) and
#   OUTDIR/NAME.err (its stderr); some also NAME.txt (what it printed) or NAME.jsonl (a trace).
#   What the commands print goes to stdout; copy the files the docs cite into docs/bench/.
# BUDGET: seconds for the parts that read it (a `timeout` on their commands); OLD (part r28a):
#   another checkout to run the same probe against.
# Parts built with run() warm each configuration up over a full-length reply, then time three
# repeats. A part that calls a tools/ probe since removed runs only at a commit that has it.
set -u
part=$1
out=$2
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Cost profiles in OUTDIR: the GPU machine has only the engine's dependencies (no platformdirs).
tandem="python3 -m app --data-dir $out/data"
run() {  # name, then bench arguments
  name=$1
  shift
  echo "== $name: tandem bench --bits 4 --dtype bfloat16 --max-tokens 192 --warmup 192 --repeats 3 --temps 0 $*"
  start=$(date +%s)
  $tandem bench --bits 4 --dtype bfloat16 --max-tokens 192 --warmup 192 --repeats 3 \
    --temps 0 --json "$out/$name.json" "$@" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
}
streams() {  # name, pair, seconds: issue 17's streams (1, 4 and 8; miss 0 and 0.1; k = 15 and Auto)
  echo "== $1: tandem bench --synthetic $2 --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128"
  start=$(date +%s)
  timeout "$3" $tandem bench --synthetic "$2" --bits 4 --dtype bfloat16 \
    --concurrent 1,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 \
    --json "$out/$1.json" 2> "$out/$1.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
}
trace() {  # name, pair, streams, ks, seconds[, flags]: streams at miss 0.1, every batched round traced
  echo "== $1: tandem bench --trace --synthetic $2 --bits 4 --dtype bfloat16 --concurrent $3 --miss 0.1 --ks $4 --temps 0 --max-tokens 128 ${6:-}"
  start=$(date +%s)
  timeout "$5" $tandem bench --trace "$out/$1.jsonl" --synthetic "$2" --bits 4 \
    --dtype bfloat16 --concurrent "$3" --miss 0.1 --ks "$4" --temps 0 --max-tokens 128 ${6:-} \
    --json "$out/$1.json" 2> "$out/$1.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
}
case "$part" in
a)
  run 70b-1b --synthetic 70b:1b --miss 0,0.1,0.28 --ks 0,8,12,14,15,auto --impls plain,tandem
  ;;
b)
  run 32b-0.5b --synthetic 32b:0.5b --miss 0,0.1 --ks 0,8,12,14,15,auto --impls plain,tandem
  run 8b-1b --synthetic 8b:1b --miss 0,0.28 --ks 0,4,8,12,14,15,auto --impls plain,tandem
  ;;
c)
  run 32b-0.5b-c --synthetic 32b:0.5b --miss 0,0.1 --ks 0,14,15,auto --impls plain,tandem
  run 8b-1b-c --synthetic 8b:1b --miss 0.28 --ks 0,4,auto --impls plain,tandem
  ;;
probe)
  python3 tools/draft_step_probe.py 1b 2>&1 | tail -8
  ;;
a1)
  run 70b-1b-miss0 --synthetic 70b:1b --miss 0 --ks 0,8,15,auto --impls plain,tandem
  ;;
a2)
  run 70b-1b-miss0.1-0.28 --synthetic 70b:1b --miss 0.1,0.28 --ks 0,8,14,15,auto --impls plain,tandem
  ;;
b1)
  run 32b-0.5b-miss0.1 --synthetic 32b:0.5b --miss 0.1 --ks 0,12,14,15,auto --impls plain,tandem
  ;;
r8a)  # run 8: the 32B and 8B pairs with the final code
  run 32b-0.5b --synthetic 32b:0.5b --miss 0,0.1 --ks 0,12,14,15,auto --impls plain,tandem
  run 8b-1b --synthetic 8b:1b --miss 0,0.28 --ks 0,8,15,auto --impls plain,tandem
  ;;
r8b)  # run 8: the 70B pair at three miss rates, one build
  run 70b-1b --synthetic 70b:1b --miss 0,0.1,0.28 --ks 0,8,14,15,auto --impls plain,tandem
  ;;
r8c)  # run 8: 70b:1b at miss 0 and 0.1 again, six repeats (rounds of one shape spread by a third)
  run 70b-1b-r6 --synthetic 70b:1b --miss 0,0.1 --ks 0,14,15,auto --impls plain,tandem --repeats 6
  ;;
r8d)  # run 8, last: 70b:1b at miss 0.1 and 0 after stale widths are measured afresh
  run 70b-1b-stale --synthetic 70b:1b --miss 0.1,0 --ks 0,14,15,auto --impls plain,tandem
  ;;
r8mlx)  # run 8: mlx-lm's loop at its default k = 3 beside Auto on 70b:1b at miss 0
  run 70b-1b-mlx --synthetic 70b:1b --miss 0 --ks 0,15,auto --impls plain,tandem,mlx-lm --mlx-lm-ks 3
  ;;
r9a)  # run 9: the 70B pair at three miss rates, one build (code F, first try)
  run 70b-1b --synthetic 70b:1b --miss 0,0.1,0.28 --ks 0,8,14,15,auto --impls plain,tandem
  ;;
r9c)  # run 9, final code: the 70B pair, five repeats, the ks that compete at each miss rate
  run 70b-1b-r5 --synthetic 70b:1b --miss 0,0.1 --ks 0,14,15,auto --impls plain,tandem --repeats 5
  run 70b-1b-r5-miss0.28 --synthetic 70b:1b --miss 0.28 --ks 0,8,auto --impls plain,tandem --repeats 5
  ;;
r9d)  # run 9, last code (optimism before stopping to draft): 70b:1b at 0.28, 32b:0.5b at 0.1
  run 70b-1b-r5-doubt-miss0.28 --synthetic 70b:1b --miss 0.28 --ks 0,8,auto --impls plain,tandem --repeats 5
  run 32b-0.5b-doubt-miss0.1 --synthetic 32b:0.5b --miss 0.1 --ks 0,14,15,auto --impls plain,tandem
  ;;
r13a)  # run 13: Auto along stretches, the 32B and 8B pairs
  run 32b-0.5b --synthetic 32b:0.5b --miss 0,0.1 --ks 0,13,14,15,auto --impls plain,tandem
  run 8b-1b --synthetic 8b:1b --miss 0 --ks 0,8,15,auto --impls plain,tandem
  ;;
r13b)  # run 13: Auto along stretches, the 70B pair at three miss rates, one build
  run 70b-1b --synthetic 70b:1b --miss 0,0.1,0.28 --ks 0,8,13,15,auto --impls plain,tandem
  ;;
r13c)  # run 13: Auto with and without stretches in one process, five repeats
  run 32b-0.5b-ab --synthetic 32b:0.5b --miss 0.1 --ks 0,13,auto,auto-pooled --impls plain,tandem --repeats 5
  run 70b-1b-ab --synthetic 70b:1b --miss 0.1 --ks 0,13,auto,auto-pooled --impls plain,tandem --repeats 5
  ;;
r14)  # run 14: a quiet re-run of 70b:1b at miss 0.1, where Auto sat near its target
  run 70b-1b-miss0.1 --synthetic 70b:1b --miss 0.1 --ks 0,13,auto --k-max 15 --impls plain,tandem
  ;;
r15a)  # run 15: the 70B pair at three miss rates, one build, the final code
  run 70b-1b --synthetic 70b:1b --miss 0,0.1,0.28 --ks 0,8,13,15,auto --impls plain,tandem
  ;;
r15b)  # run 15: the 32B and 8B pairs, then mlx-lm's loop at its default k = 3 on 70b:1b
  run 32b-0.5b --synthetic 32b:0.5b --miss 0,0.1 --ks 0,13,14,15,auto --impls plain,tandem
  run 8b-1b --synthetic 8b:1b --miss 0 --ks 0,8,15,auto --impls plain,tandem
  run 70b-1b-mlx --synthetic 70b:1b --miss 0 --ks 0,15,auto --impls plain,tandem,mlx-lm --mlx-lm-ks 3
  ;;
r15c)  # run 15, last: the draft step of a profile is the fastest of three runs
  run 8b-1b-c --synthetic 8b:1b --miss 0 --ks 0,8,15,auto --impls plain,tandem
  run 70b-1b-c --synthetic 70b:1b --miss 0.28 --ks 0,8,auto --impls plain,tandem
  ;;
r17)  # every batched round of issue 17's miss-0.1 streams, as planned and as run (bench --trace)
  trace trace-70b-1b-miss0.1 70b:1b 1,4,8 15,auto ${BUDGET:-480}
  ;;
r18)  # run 18: the verify forward's parts, and the draft on a second stream beside it
  for shape in 70b 8b; do
    timeout 120 python3 tools/wide_matmul_probe.py --shape $shape
  done 2>&1 | tee "$out/wide-matmul.txt"
  timeout ${BUDGET:-150} python3 tools/verify_forward_probe.py --pair 70b:1b 2>&1 | tee "$out/verify-forward-70b-1b.txt"
  ;;
r18b)  # run 18: 8b:1b's streams with the final code
  streams streams-8b-1b 8b:1b ${BUDGET:-300}
  ;;
r18c)  # run 18: 8b:1b's Auto at miss 0.1 traced; 70b:1b's streams with Auto run first
  trace trace-8b-1b-miss0.1 8b:1b 4 15,auto 90
  trace trace-70b-1b-auto-first-miss0.1 70b:1b 4,8 auto,15 ${BUDGET:-240}
  ;;
r18d)  # run 18: 70b:1b's 8 streams at miss 0.1 under two CUDA graph settings, traced
  for ops in 20 100; do
    echo "== MLX_CUDA_GRAPH_CACHE_SIZE=4000 MLX_MAX_OPS_PER_BUFFER=$ops"
    (export MLX_CUDA_GRAPH_CACHE_SIZE=4000 MLX_MAX_OPS_PER_BUFFER=$ops
     trace trace-cache4000-ops$ops 70b:1b 8 15,auto 180)
  done
  ;;
r19)  # run 19: the streams with the app's CUDA graph settings, within one device call
  unset MLX_MAX_OPS_PER_BUFFER MLX_CUDA_GRAPH_CACHE_SIZE
  end=$(( $(date +%s) + ${BUDGET:-540} ))
  streams streams-70b-1b 70b:1b $(( end - $(date +%s) - 150 ))  # 150 s kept for 8b:1b
  streams streams-8b-1b 8b:1b $(( end - $(date +%s) ))
  ;;
r19b)  # run 19: whether caches kept side by side would pay for the target's verify forward
  for b in 8 4; do
    timeout ${BUDGET:-150} python3 tools/side_by_side_probe.py --pair 70b:1b --streams $b
  done 2>&1 | tee "$out/side-by-side-70b.txt"
  ;;
r19c)  # run 19: 8b:1b at miss 0 with short drafts and none (batched plain), 4 and 8 streams
  echo "== streams-8b-1b-short: tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0 --ks 0,2,4,8 --temps 0 --max-tokens 128"
  start=$(date +%s)
  timeout ${BUDGET:-270} $tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 \
    --concurrent 4,8 --miss 0 --ks 0,2,4,8 --temps 0 --max-tokens 128 \
    --json "$out/streams-8b-1b-short.json" 2> "$out/streams-8b-1b-short.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  ;;
r19d)  # run 19: whether rounds of cache lengths never seen before run slower than replayed ones
  timeout 130 python3 tools/side_by_side_probe.py --pair 70b:1b --streams 8 --replay 2>&1 |
    tee "$out/side-by-side-replay-70b.txt"
  timeout 60 python3 tools/side_by_side_probe.py --pair 70b:1b --streams 1 --replay 2>&1 |
    tee -a "$out/side-by-side-replay-70b.txt"
  for pair in 70b:1b 8b:1b; do
    name=streams-${pair%%:*}-fresh
    echo "== $name: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss 0.1 --ks 15 --temps 0 --max-tokens 128 --fresh-shapes"
    start=$(date +%s)
    timeout $([ $pair = 70b:1b ] && echo 170 || echo 100) $tandem bench --synthetic $pair --bits 4 --dtype bfloat16 \
      --concurrent 1,4,8 --miss 0.1 --ks 15 --temps 0 --max-tokens 128 --fresh-shapes \
      --json "$out/$name.json" 2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  ;;
r19e)  # run 19: fresh cache lengths under MLX's own graph settings and with CUDA graphs off
  for env in "MLX_CUDA_GRAPH_CACHE_SIZE=400 MLX_MAX_OPS_PER_BUFFER=20" "MLX_USE_CUDA_GRAPHS=0"; do
    case $env in *GRAPHS=0) name=streams-70b-fresh-graphs-off ;; *) name=streams-70b-fresh-graphs-mlx ;; esac
    echo "== $env: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --concurrent 1,8 --miss 0.1 --ks 15 --temps 0 --max-tokens 128 --fresh-shapes"
    start=$(date +%s)
    env $env timeout 150 $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 \
      --concurrent 1,8 --miss 0.1 --ks 15 --temps 0 --max-tokens 128 --fresh-shapes \
      --json "$out/$name.json" 2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  timeout 100 python3 tools/side_by_side_probe.py --pair 70b:1b --streams 2 --rounds 24 --replay 2>&1 |
    tee "$out/side-by-side-replay-70b.txt"
  ;;
r20)  # run 20: the batch's target caches side by side against apart, on fresh cache lengths
  for pair in 70b:1b 8b:1b; do
    for layout in --no-side-by-side --side-by-side; do
      name=streams-${pair%%:*}-fresh$([ $layout = --side-by-side ] && echo -side-by-side)
      echo "== $name: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss 0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes $layout"
      start=$(date +%s)
      timeout $([ $pair = 70b:1b ] && echo 190 || echo 70) $tandem bench --synthetic $pair \
        --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss 0.1 --ks 15,auto --temps 0 \
        --max-tokens 128 --fresh-shapes $layout --json "$out/$name.json" 2> "$out/$name.err"
      echo "rc=$? in $(( $(date +%s) - start )) s"
    done
  done
  ;;
r20b)  # run 20: every round traced on fresh lengths at several fixed k (tools/round_fit.py fits them)
  trace trace-8b-1b-fresh 8b:1b 4,8 3,7,15,auto 200 --fresh-shapes
  trace trace-70b-1b-fresh 70b:1b 4 7,15,auto 330 --fresh-shapes
  ;;
r20c)  # run 20: every round traced with the target caches side by side, 8 streams on fresh lengths
  trace trace-8b-1b-side 8b:1b 8 15,auto 120 "--fresh-shapes --side-by-side"
  trace trace-70b-1b-side 70b:1b 8 15,auto 330 "--fresh-shapes --side-by-side"
  ;;
r21a|r21b)  # run 21: issue 17's streams as the app runs them, on lengths never seen before
  [ $part = r21a ] && set -- 70b:1b 560 || set -- 8b:1b 170
  name=streams-${1%%:*}-run21
  echo "== $name: tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 1,2,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout $2 $tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 1,2,4,8 \
    --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes --json "$out/$name.json" \
    2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  ;;
r24)  # run 24: batched Auto along stretches against per position, at miss 0.1
  for spec in "70b:1b 280" "8b:1b 110"; do
    set -- $spec
    name=streams-${1%%:*}-run24-stretch
    echo "== $name: tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0.1 --ks 15,auto-pooled,auto --temps 0 --max-tokens 128 --fresh-shapes"
    start=$(date +%s)
    timeout $2 $tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 4,8 \
      --miss 0.1 --ks 15,auto-pooled,auto --temps 0 --max-tokens 128 --fresh-shapes \
      --json "$out/$name.json" 2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  ;;
r25a|r25b)  # run 25: wide reads dequantized, then issue 17's streams with them
  [ $part = r25a ] && set -- 70b:1b 4,8 440 || set -- 8b:1b 1,2,4,8 260
  name=wide-${1%%:*}-run25
  echo "== $name: tools/wide_read_probe.py --pair $1"
  start=$(date +%s)
  timeout 120 python3 tools/wide_read_probe.py --pair $1 > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  name=streams-${1%%:*}-run25-wide
  echo "== $name: tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent $2 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout $3 $tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent $2 \
    --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  [ $part = r25b ] && sh "$0" r24b "$out"
  ;;
r25c)  # run 25: the 70B's wide reads with one projection's weights dequantized at a time
  echo "== wide-70b-run25c: tools/wide_read_probe.py --pair 70b:1b --rows 256,512"
  start=$(date +%s)
  timeout 150 python3 tools/wide_read_probe.py --pair 70b:1b --rows 256,512 \
    > "$out/wide-70b-run25c.txt" 2> "$out/wide-70b-run25c.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/wide-70b-run25c.txt"
  ;;
r25d)  # run 25: the 70B's reads and streams, dequantized weights queued up to 2 GiB
  echo "== wide-70b-run25d: tools/wide_read_probe.py --pair 70b:1b --rows 512"
  start=$(date +%s)
  timeout 130 python3 tools/wide_read_probe.py --pair 70b:1b --rows 512 \
    > "$out/wide-70b-run25d.txt" 2> "$out/wide-70b-run25d.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/wide-70b-run25d.txt"
  name=streams-70b-run25d-wide
  echo "== $name: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout 420 $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 \
    --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r26b)  # run 26: part r25d with one layer's dequantized weights queued
  sh "$0" r25d "$out"
  ;;
r26c)  # run 26: 70b:1b at 1 and 2 streams
  name=streams-70b-run26-12
  echo "== $name: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --concurrent 1,2 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout ${BUDGET:-420} $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 \
    --concurrent 1,2 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r26d)  # run 26: a lone request's rounds at miss 0 and 0.1, by part, graphs on and off
  for graphs in on off; do
    echo "== miss-rounds-8b-run26-graphs-$graphs: tools/miss_round_probe.py 8b:1b 15 256"
    start=$(date +%s)
    if [ $graphs = on ]; then
      timeout 150 python3 tools/miss_round_probe.py 8b:1b 15 256 2> "$out/miss-$graphs.err"
    else
      MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 tools/miss_round_probe.py 8b:1b 15 256 \
        2> "$out/miss-$graphs.err"
    fi
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  for shape in 1b 1b:full; do
    echo "== stacked-step-run26-$shape: tools/stacked_step_probe.py $shape"
    start=$(date +%s)
    timeout 90 python3 tools/stacked_step_probe.py $shape 2> "$out/stacked-$shape.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  ;;
r28a)  # run 28: what plain steps are measured at, old rule (gap, PYTHONPATH=$OLD) against new (average)
  for code in ${OLD:+old} new; do
    echo "== plain-pace-$code: tools/plain_pace_probe.py 8b bfloat16 256"
    start=$(date +%s)
    if [ $code = old ]; then
      PYTHONPATH=$OLD:$PYTHONPATH timeout 150 python3 tools/plain_pace_probe.py 8b bfloat16 256 2> "$out/pace-$code.err"
    else
      timeout 150 python3 tools/plain_pace_probe.py 8b bfloat16 256 2> "$out/pace-$code.err"
    fi
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  ;;
r28b)  # run 28: one 8b:1b request alone (single decoder and batch), plain steps timed on average
  name=streams-r28b-8b-1b
  echo "== $name: tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 1 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout ${BUDGET:-200} $tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 \
    --concurrent 1 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r28c|r28d|r28e|r28f)  # run 28: requests that join together copy the prompt rows they share
  share=--share-prompts
  case $part in
    r28c) pair=70b:1b; streams=4,8 ;;
    r28d) pair=8b:1b; streams=1,2,4,8 ;;
    r28e) pair=70b:1b; streams=4,8; share=--no-share-prompts ;;
    r28f) pair=8b:1b; streams=4,8; share=--no-share-prompts ;;
  esac
  name=streams-$part-$(echo $pair | tr : -)
  echo "== $name: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --concurrent $streams --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes $share"
  start=$(date +%s)
  timeout ${BUDGET:-300} $tandem bench --synthetic $pair --bits 4 --dtype bfloat16 \
    --concurrent $streams --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    $share --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r27d|r27e|r27f)  # run 27: a lone request decodes plainly a step ahead; warm single-request references
  ks=15,auto
  case $part in
    r27d) pair=8b:1b; streams=1,2,4,8 ;;
    r27e) pair=70b:1b; streams=4,8 ;;
    r27f) pair=8b:1b; streams=1,4; ks=auto ;;
  esac
  name=streams-$part-$(echo $pair | tr : -)
  echo "== $name: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --concurrent $streams --miss 0,0.1 --ks $ks --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout ${BUDGET:-300} $tandem bench --synthetic $pair --bits 4 --dtype bfloat16 \
    --concurrent $streams --miss 0,0.1 --ks $ks --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r26e)  # run 26: 8b:1b's streams, requests that come together read in one forward
  name=streams-8b-run26e
  echo "== $name: tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 1,2,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout ${BUDGET:-240} $tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 \
    --concurrent 1,2,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
r24b)  # run 24: 8b:1b's Auto along stretches first, then without
  name=streams-8b-run24-stretch-first
  echo "== $name: tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0.1 --ks auto,auto-pooled --temps 0 --max-tokens 128 --fresh-shapes"
  start=$(date +%s)
  timeout 100 $tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 \
    --miss 0.1 --ks auto,auto-pooled --temps 0 --max-tokens 128 --fresh-shapes \
    --json "$out/$name.json" 2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  ;;
r16)  # run 16: issue 17's streams with the final code, within one device call
  streams streams-70b-1b 70b:1b ${BUDGET:-480}
  ;;
r9b)  # run 9: the 32B and 8B pairs
  run 32b-0.5b --synthetic 32b:0.5b --miss 0,0.1 --ks 0,12,14,15,auto --impls plain,tandem
  run 8b-1b --synthetic 8b:1b --miss 0 --ks 0,8,15,auto --impls plain,tandem
  ;;
r9mlx)  # run 9: mlx-lm's loop at its default k = 3 beside Auto on 70b:1b at miss 0
  run 70b-1b-mlx --synthetic 70b:1b --miss 0 --ks 0,15,auto --impls plain,tandem,mlx-lm --mlx-lm-ks 3
  ;;
r10a)  # run 10: 32b:0.5b at miss 0.1 with the doubt rule (run 9's last line, cut off)
  run 32b-0.5b-doubt-miss0.1 --synthetic 32b:0.5b --miss 0.1 --ks 0,11,14,15,auto --impls plain,tandem
  ;;
r10b)  # run 10: several streams on one batch; 70b:1b at miss 0 first, then 0.1 on the same build
  end=$(( $(date +%s) + 540 ))  # one device call; each miss rate's JSON is written when it ends
  for spec in "70b:1b 0,0.1 120" "8b:1b 0 0"; do
    set -- $spec  # pair, miss rates, seconds kept back for the runs after it
    name=streams-${1%%:*}
    echo "== $name: tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 1,2,4,8 --miss $2 --ks 15 --max-tokens 128"
    start=$(date +%s)
    timeout $(( end - start - $3 )) $tandem bench --synthetic "$1" --bits 4 --dtype bfloat16 \
      --concurrent 1,2,4,8 --miss "$2" --ks 15 --temps 0 --max-tokens 128 --json "$out/$name.json" \
      2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  done
  ;;
r11a|r11b)  # run 11: streams at k = 15 and at Auto planned from the batch's own costs
  end=$(( $(date +%s) + ${BUDGET:-520} ))  # one device call; each miss rate's JSON is written when it ends
  case "$part" in r11a) pair=70b:1b ;; *) pair=8b:1b ;; esac
  name=streams-${pair%%:*}
  echo "== $name: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --concurrent 1,2,4,8 --miss 0,0.1 --ks 15,auto --max-tokens 128"
  start=$(date +%s)
  timeout $(( end - start )) $tandem bench --synthetic "$pair" --bits 4 --dtype bfloat16 \
    --concurrent 1,2,4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --json "$out/$name.json" \
    2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  ;;
r11e)  # run 11, last: 70b:1b at miss 0.1 after the draft's catch-up is priced apart from its steps
  echo "== streams-70b-catchup: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss 0.1 --ks 15,auto --max-tokens 128"
  timeout ${BUDGET:-280} $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 \
    --concurrent 1,4,8 --miss 0.1 --ks 15,auto --temps 0 --max-tokens 128 \
    --json "$out/streams-70b-catchup.json" 2> "$out/streams-70b-catchup.err"
  echo "rc=$?"
  ;;
r12a|r12b|r12c)  # run 12: the batch's draft steps stacked where that measures faster
  end=$(( $(date +%s) + ${BUDGET:-520} ))
  streams() {  # pair, miss rates, seconds kept back for what runs after it
    name=streams-${1%%:*}-miss$(echo "$2" | tr , -)
    echo "== $name: tandem bench --synthetic $1 --bits 4 --dtype bfloat16 --concurrent 1,4,8 --miss $2 --ks 15,auto --temps 0 --max-tokens 128"
    start=$(date +%s)
    timeout $(( end - start - $3 )) $tandem bench --synthetic "$1" --bits 4 --dtype bfloat16 \
      --concurrent 1,4,8 --miss "$2" --ks 15,auto --temps 0 --max-tokens 128 \
      --json "$out/$name.json" 2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
  }
  if [ "$part" = r12c ]; then  # after the first draft step runs stacked too
    echo "== first-step probe: python3 tools/first_step_probe.py 8b:1b 8"
    timeout 150 python3 tools/first_step_probe.py 8b:1b 8 2> "$out/probe.err"
    streams 70b:1b 0,0.1 0
  elif [ "$part" = r12a ]; then
    echo "== batch-70b: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --batch-profile"
    $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --batch-profile \
      --json "$out/batch-70b.json" 2> "$out/batch-70b.err"
    echo "rc=$?"
    streams 70b:1b 0.1 0
  else
    streams 70b:1b 0 110
    streams 8b:1b 0,0.1 0
  fi
  ;;
r11d)  # run 11: the (sequences, rows) table three ways, and the 1B draft's step packed or apart
  echo "== 70b:1b: tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --batch-profile"
  $tandem bench --synthetic 70b:1b --bits 4 --dtype bfloat16 --batch-profile \
    --json "$out/batch-70b.json" 2> "$out/batch-70b.err"
  echo "rc=$?"
  ;;
r11c)  # run 11: the two miss-0.1 rows Auto fell short on, with the round-start model
  run 32b-0.5b-miss0.1 --synthetic 32b:0.5b --miss 0.1 --ks 0,12,13,14,15,auto --impls plain,tandem
  run 70b-1b-miss0.1 --synthetic 70b:1b --miss 0.1 --ks 0,14,15,auto --impls plain,tandem
  ;;
batch)  # issue 17's ground: one forward of 1-8 sequences x 1-16 rows, batched and packed
  for pair in 70b:1b 8b:1b; do
    echo "== $pair: tandem bench --synthetic $pair --bits 4 --dtype bfloat16 --batch-profile"
    $tandem bench --synthetic "$pair" --bits 4 --dtype bfloat16 --batch-profile \
      --json "$out/batch-${pair%%:*}.json" 2> "$out/batch-${pair%%:*}.err"
  done
  ;;
fresh)  # run 34's open question: do configurations of one process still spread with --fresh-shapes?
  for shapes in replayed fresh; do
    flag=""; [ "$shapes" = fresh ] && flag=--fresh-shapes
    run "8b-1b-$shapes" --synthetic 8b:1b --miss 0 --ks 15,auto,auto-uncut \
      --impls plain,mlx-lm,tandem --mlx-lm-ks 15 $flag
  done
  ;;
open)  # what the open issues still need measured, in one device call: about 570 s
  BUDGET=170 sh "$0" hybrid "$out"
  BUDGET=200 sh "$0" hstreams "$out"
  BUDGET=190 sh "$0" mtpstreams "$out"
  ;;
open2)  # a second call: 8b:1b's streams at miss 0.1, configurations' spread (then: spells)
  name=streams-8b-1b-miss0.1
  echo "== $name: tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  timeout 200 $tandem bench --synthetic 8b:1b --bits 4 --dtype bfloat16 --concurrent 4,8 \
    --miss 0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes --json "$out/$name.json" \
    2> "$out/$name.err"
  sh "$0" fresh "$out"
  ;;
spells)  # whether the hybrid 27B's plain steps (JSON rounds: ms each) run in spells by graph setting
  for env in "" "MLX_CUDA_GRAPH_CACHE_SIZE=400 MLX_MAX_OPS_PER_BUFFER=20" "MLX_USE_CUDA_GRAPHS=0"; do
    name=spells-$(echo "${env:-app}" | tr ' =' '-_')
    echo "== $name: $env tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 --dtype bfloat16 --ks 0 --impls tandem --max-tokens 256 --warmup 64 --repeats 3"
    env $env timeout 150 $tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 \
      --dtype bfloat16 --miss 0 --ks 0 --impls tandem --temps 0 --max-tokens 256 --warmup 64 \
      --repeats 3 --json "$out/$name.json" 2> "$out/$name.err" | tail -3
  done
  ;;
hybrid)  # the hybrid 27B with the 0.8B draft, one request (the benchmarks summary's hybrid table)
  name=hybrid-27b-0.8b
  echo "== $name: tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 --dtype bfloat16 --miss 0.1,0.28 --ks 8,15,auto --impls plain,tandem --temps 0 --max-tokens 128 --warmup 32 --repeats 2"
  start=$(date +%s)
  timeout ${BUDGET:-300} $tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 \
    --dtype bfloat16 --miss 0.1,0.28 --ks 8,15,auto --impls plain,tandem --temps 0 \
    --max-tokens 128 --warmup 32 --repeats 2 --json "$out/$name.json" > "$out/$name.txt" \
    2> "$out/$name.err"
  echo "rc=$? in $(( $(date +%s) - start )) s"
  cat "$out/$name.txt"
  ;;
hstreams)  # the hybrid 27B's streams, verified and drafted in one merged forward a step
  echo "== hybrid streams: tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 --fresh-shapes"
  timeout "${BUDGET:-480}" $tandem bench --synthetic qwen3.6-27b:qwen3.5-0.8b --bits 4 \
    --dtype bfloat16 --concurrent 4,8 --miss 0,0.1 --ks 15,auto --temps 0 --max-tokens 128 \
    --fresh-shapes --json "$out/hybrid-streams.json" 2> "$out/hybrid-streams.err"
  ;;
mtp)  # the hybrid 27B drafting with its own MTP head (depth 1-8, Auto), then with the 0.8B draft
  end=$(( $(date +%s) + ${BUDGET:-570} ))
  for spec in "mtp 0,0.1,0.28 1,2,3,4,6,8,auto 200" "qwen3.5-0.8b 0.1 4,8,15,auto 0"; do
    set -- $spec  # drafter, miss rates, ks, seconds kept back for the run after it
    name=27b-$1
    echo "== $name: tandem bench --synthetic qwen3.6-27b:$1 --bits 4 --dtype bfloat16 --miss $2 --ks $3 --impls plain,tandem --temps 0 --max-tokens 128 --warmup 32 --repeats 2"
    start=$(date +%s)
    timeout $(( end - start - $4 )) $tandem bench --synthetic qwen3.6-27b:$1 --bits 4 \
      --dtype bfloat16 --miss $2 --ks $3 --impls plain,tandem --temps 0 --max-tokens 128 \
      --warmup 32 --repeats 2 --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err"
    echo "rc=$? in $(( $(date +%s) - start )) s"
    cat "$out/$name.txt"
  done
  ;;
mtpstreams)  # the MTP head's streams
  echo "== mtp streams: tandem bench --synthetic qwen3.6-27b:mtp --bits 4 --dtype bfloat16 --concurrent 4,8 --miss 0,0.1 --ks 4,auto --temps 0 --max-tokens 128 --fresh-shapes"
  timeout "${BUDGET:-480}" $tandem bench --synthetic qwen3.6-27b:mtp --bits 4 \
    --dtype bfloat16 --concurrent 4,8 --miss 0,0.1 --ks 4,auto --temps 0 --max-tokens 128 \
    --fresh-shapes --json "$out/mtp-streams.json" 2> "$out/mtp-streams.err"
  ;;
mlx)
  run 70b-1b-mlx --synthetic 70b:1b --miss 0 --ks 0,4,15,auto --mlx-lm-ks 3 --ttft
  ;;
esac
