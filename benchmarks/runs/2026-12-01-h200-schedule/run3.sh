#!/usr/bin/env bash
# The work schedule on the H200: the gpu tests of every kernel path, then the graphed step before/after.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
specs=$(cat gpu_run/specs.txt)
for tree in base new; do
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 100 python3 gpu_run/ab2.py $tree $specs 2>&1 | tail -n 2 | tee -a $OUT/ab2.jsonl
done
timeout ${TEST_S:-300} python3 -m pytest -q -x -rf -m gpu tests/test_gpu.py tests/test_poisoned.py tests/test_hf.py \
  -k "${KEXPR:-not descriptor}" -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log | head -30
