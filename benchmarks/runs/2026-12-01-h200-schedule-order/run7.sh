#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
timeout ${TEST_S:-270} python3 -m pytest -q -x -rf --durations=15 -m gpu ${TESTS:-tests/test_gpu.py tests/test_noncausal.py tests/test_poisoned.py} -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log | head -20
specs=$(cat gpu_run/specs.txt)
for tree in new base; do
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 110 python3 gpu_run/ab2.py $tree $specs > $OUT/ab2_$tree.log 2>&1; tail -n 1 $OUT/ab2_$tree.log
done
PYTHONPATH=$PWD timeout 40 python3 gpu_run/twin.py > $OUT/twin.log 2>&1; tail -n 2 $OUT/twin.log
sel=$(echo $specs | tr ' ' '\n' | grep -E "^(R2|R5u|C1|C4|C7)=")
PYTHONPATH=$PWD MLA_DCP_PDL=0 timeout 40 python3 gpu_run/prof2.py new $sel > $OUT/prof2_new.log 2>&1; tail -n 1 $OUT/prof2_new.log
