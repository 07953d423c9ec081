#!/bin/bash
# Run zz27 (fourteenth session, call 4), from the repository root on the H200 with the test wheels
# in .whl, at the session's final kernels and plans: the record (`python -m mla_dcp.bench
# --repeat 3`), the gpu-marked tests other than the seesaw's (run zz25 ran those), then which of C2's
# conversion sites is exposed now (run_all.sh convert_sites).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 120 python3 -m mla_dcp.bench --repeat 3 --out $O/bench > $O/bench.log 2>&1
tail -10 $O/bench.log; date +%T
timeout 320 python3 -m pytest -q -m gpu tests -p no:cacheprovider -k "not seesaw" > $O/gpu_tests.log 2>&1
tail -1 $O/gpu_tests.log; date +%T
timeout 120 python3 scripts/stage_variants.py $O/sites C2 copy,no_convert_ahead,no_convert_other,no_convert_rope,no_convert \
  > $O/sites.log 2>&1
tail -4 $O/sites.log; date +%T
