#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 python3 gpu_run/smoke8.py 2>&1 | tee $OUT/smoke.log | grep -v Warn | tail -8
[ "${PIPESTATUS[0]}" = 0 ] || { echo SMOKE FAILED; exit 1; }
python3 -c "from mla_dcp import bench; print(bench.measure_ceilings())" 2>&1 | tail -1 | tee $OUT/ab.log
for v in stmatrix blocked stmatrix blocked; do timeout 100 python3 gpu_run/ab8.py $v 2>&1 | grep -v Warn | tail -2 | tee -a $OUT/ab.log; done
timeout 170 python3 -m pytest -q -n 8 -m gpu tests/test_fp8_products.py tests/test_batch_invariant.py tests/test_poisoned.py tests/test_gpu.py -k "fp8 or e4m3 or products" 2>&1 | tee $OUT/tests.log | tail -3
