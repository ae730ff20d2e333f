#!/bin/sh
# Second H200 run: the pairs where Auto fell short, after Auto learned to lean on the
# position before (not the pooled rate) and to decode plainly where drafting cannot pay.
# Usage on the GPU machine, after `source .gpu/setup.sh`:  sh tools/h200_rerun.sh OUTDIR
set -u
out=$1
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
run() {
  name=$1
  shift
  echo "== $name: tandem bench --bits 4 --dtype bfloat16 --max-tokens 192 --repeats 3 $*"
  python3 -m app bench --bits 4 --dtype bfloat16 --max-tokens 192 --repeats 3 --temps 0 \
    --mlx-lm-ks 3 "$@" 2>/dev/null | grep -v '^ *[0-9]* *[0-9.]* *[0-9.]*$'
}
run 70b-1b-miss0.28 --synthetic 70b:1b --miss 0.28 --ks 0,4,8,12,15,auto
run 32b-0.5b-miss0.1 --synthetic 32b:0.5b --miss 0.1 --ks 0,8,12,15,auto
run 8b-1b-miss0.28 --synthetic 8b:1b --miss 0.28 --ks 0,4,8,auto --impls plain,tandem
run 70b-1b-miss0.1 --synthetic 70b:1b --miss 0.1 --ks 0,8,12,15,auto
