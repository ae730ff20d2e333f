#!/bin/sh
# The H200 runs behind docs/benchmarks.md (issue: Auto from the verify-cost curve).
# Usage on the GPU machine, after `source .gpu/setup.sh`:  sh tools/h200_bench.sh PART OUTDIR
# PART a: 70b:1b at miss 0, 0.1, 0.28; PART b: 32b:0.5b at miss 0, 0.1, 8b:1b at miss 0,
# and 8b:1b at miss 0.28 with and without the draft cutoff.
set -u
part=$1
out=$2
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
run() {  # name, then bench arguments
  name=$1
  shift
  echo "== $name: tandem bench $*" | tee -a "$out/commands.txt"
  python3 -m app bench --bits 4 --dtype bfloat16 --max-tokens 192 --repeats 3 \
    --temps 0 --mlx-lm-ks 3 --ttft --json "$out/$name.json" "$@" \
    > "$out/$name.txt" 2> "$out/$name.err"
  echo "rc=$?" >> "$out/$name.err"
  cat "$out/$name.txt"
}
case "$part" in
a)
  for miss in 0 0.1 0.28; do
    run "70b-1b-miss$miss" --synthetic 70b:1b --miss "$miss" --ks 0,4,8,12,15,16,auto
  done
  ;;
b)
  for miss in 0 0.1; do
    run "32b-0.5b-miss$miss" --synthetic 32b:0.5b --miss "$miss" --ks 0,4,8,12,15,16,auto
  done
  run "8b-1b-miss0" --synthetic 8b:1b --miss 0 --ks 0,4,8,12,15,16,auto
  run "8b-1b-miss0.28" --synthetic 8b:1b --miss 0.28 --ks 0,4,8,auto --impls plain,tandem
  run "8b-1b-miss0.28-cutoff" --synthetic 8b:1b --miss 0.28 --ks 0,4,8,auto \
    --impls plain,tandem --draft-cutoff
  ;;
esac
