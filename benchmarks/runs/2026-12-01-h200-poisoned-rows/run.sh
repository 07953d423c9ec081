#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
timeout ${TEST_S:-330} python3 -m pytest -q --maxfail=10 -rf -m gpu ${TESTS:-tests/test_gpu.py} ${KEXPR:+-k "$KEXPR"} -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log | head -40
[ "${CONFIGS:-}" = none ] || for i in ${ROUNDS:-1}; do
  for tree in base new; do
    if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
    PYTHONPATH=$p timeout 120 python3 gpu_run/ab.py $tree ${CONFIGS:-C1,C2,C4,C7} 2>&1 | tail -n 3 | tee -a $OUT/ab.jsonl
  done
done
