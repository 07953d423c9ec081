#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
specs=$(cat gpu_run/specs.txt)
for tree in base new; do
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 150 python3 gpu_run/ab2.py $tree $specs > $OUT/ab2_$tree.log 2>&1; tail -n 1 $OUT/ab2_$tree.log
done
PYTHONPATH=$PWD timeout 60 python3 gpu_run/prof.py $(echo $specs | tr ' ' '\n' | grep -E '^(R1|R2|R4|R4u|C1|C4|C7)=') > $OUT/prof.json 2>$OUT/prof.err
timeout ${TEST_S:-240} python3 -m pytest -q -rf -m gpu tests/test_gpu.py tests/test_poisoned.py tests/test_schedule.py tests/test_noncausal.py \
  -k "${KEXPR:-not descriptor}" -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log | head -30
