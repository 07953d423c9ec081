#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
specs=$(cat gpu_run/specs.txt)
sel=$(echo $specs | tr ' ' '\n' | grep -E "^(${PROF:-R1u|R2|R2u|R4|R5|R5u|C1|C5|C7})=")
for tree in base new; do
  if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p MLA_DCP_PDL=0 timeout 100 python3 gpu_run/prof2.py $tree $sel > $OUT/prof2_$tree.log 2>&1; tail -n 1 $OUT/prof2_$tree.log
done
[ -n "${AB:-}" ] && for tree in new; do PYTHONPATH=$PWD timeout 150 python3 gpu_run/ab2.py $tree $specs > $OUT/ab2_$tree.log 2>&1; tail -n 1 $OUT/ab2_$tree.log; done
[ -n "${TESTS:-}" ] && timeout ${TEST_S:-400} python3 -m pytest -q -x -rf -m gpu $TESTS -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log 2>/dev/null | head -30
