#!/bin/bash
# Run zz35 (fifteenth session, call 3), from the repository root on the H200 with the test wheels
# in .whl, at 0c0f7f6 (e4m3 q staging in two round trips): the record (`python -m mla_dcp.bench
# --repeat 3`), the seesaw's GPU tests, and compute-sanitizer memcheck on the kernels that stage
# q through registers (e4m3: seesaw at 64- and 16-token pages, narrow).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 150 python3 -m mla_dcp.bench --repeat 3 --out $O/bench > $O/bench.log 2>&1
tail -10 $O/bench.log; date +%T
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k seesaw > $O/tests.log 2>&1
tail -1 $O/tests.log; date +%T
for run in "fp8 block=64" "fp8 block=16" "fp8 narrow"; do
  set -- $run
  timeout 75 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize_one.py $1 $2 2>&1 \
    | tail -n 5 > $O/memcheck_$1_${2#block=}.log
  echo "$run: $(tail -1 $O/memcheck_$1_${2#block=}.log)"
done; date +%T
