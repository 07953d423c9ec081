#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 120 python3 gpu_run/smoke8.py 2>&1 | tee $OUT/smoke.log | tail -20
[ "${PIPESTATUS[0]}" = 0 ] || { echo SMOKE FAILED; exit 1; }
timeout 200 python3 -m pytest -q -n 8 -m gpu tests/test_fp8_products.py tests/test_batch_invariant.py tests/test_poisoned.py tests/test_gpu.py -k "fp8 or e4m3 or products" 2>&1 | tee $OUT/tests.log | tail -8
timeout 120 python3 benchmarks/probes/fp8_products_accuracy.py $OUT/acc C2,R5,C3f8,C5f8 2>&1 | tail -12
timeout 150 python3 -m mla_dcp.bench --configs C1,C2,R2,R5,C3f8,C5f8 --no-baselines --fp8-products --out $OUT/fp8 2>&1 | tail -14
timeout 110 python3 -m mla_dcp.bench --configs C1,C2,R5,C3f8,C5f8 --no-baselines --out $OUT/exact 2>&1 | tail -12
rm -f $OUT/*/roofline.png
