#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
specs=$(cat gpu_run/specs.txt)
for tree in base new; do
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 120 python3 gpu_run/ab2.py $tree $specs > $OUT/ab2_$tree.log 2>&1; tail -n 1 $OUT/ab2_$tree.log
done
sel=$(echo $specs | tr ' ' '\n' | grep -E "^(${PROF:-R2|R5u|C1|C7})=")
for tree in new ${VARS:-}; do
  if [ $tree = new ]; then p=$PWD; else p=gpu_run/$tree; fi
  PYTHONPATH=$p MLA_DCP_PDL=0 timeout 60 python3 gpu_run/prof2.py $tree $sel > $OUT/prof2_$tree.log 2>&1; tail -n 1 $OUT/prof2_$tree.log
done
timeout ${TEST_S:-200} python3 -m pytest -q -x -rf -m gpu ${TESTS:-tests/test_gpu.py tests/test_noncausal.py} -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
tail -n 5 $OUT/gpu_tests.log
