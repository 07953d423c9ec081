#!/bin/bash
# Run zz25 (fourteenth session, call 2), from the repository root on the H200 with the test wheels
# in .whl: the seesaw's GPU tests and compute-sanitizer memcheck (e4m3 at 64- and 16-token pages,
# bf16) with the scores in the order own half, rope, other half (run zz24), then the record
# (`python -m mla_dcp.bench --repeat 3`).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k seesaw > $O/tests.log 2>&1
tail -1 $O/tests.log; date +%T
for run in "fp8 p64" "fp8 block=16" "bf16 p64"; do
  set -- $run
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize_one.py $1 \
    ${2#p64} 2>&1 | tail -n 5 > $O/memcheck_$1_${2#block=}.log
  tail -1 $O/memcheck_$1_${2#block=}.log
done; date +%T
timeout 300 python3 -m mla_dcp.bench --repeat 3 --out $O/bench > $O/bench.log 2>&1
tail -12 $O/bench.log; date +%T
