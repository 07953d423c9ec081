#!/usr/bin/env bash
# A/B of the kernel layout move: tree before it (gpu_run/base = dafc499) against this tree, in turns
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -rf -n 4 -m gpu tests/test_hf.py -p no:cacheprovider > $OUT/gpu_hf.log 2>&1; tail -n 2 $OUT/gpu_hf.log
specs=$(cat gpu_run/specs.txt)
for turn in new1 base1 new2 base2; do
  tree=${turn%?}
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 120 python3 gpu_run/ab2.py $turn $specs > $OUT/ab2_$turn.log 2>&1; tail -c 300 $OUT/ab2_$turn.log; echo
done
PYTHONPATH=$PWD timeout 60 python3 benchmarks/probes/host_time.py $OUT/host C7 C4 > $OUT/host_time.log 2>&1; tail -n 12 $OUT/host_time.log
