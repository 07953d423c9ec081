#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 100 python3 gpu_run/eager_gpu.py C7 C4 > $OUT/eager_gpu.log 2>&1; echo "eager_gpu rc=$?"; grep -v Warn $OUT/eager_gpu.log | cut -c1-160
timeout 440 python3 -m pytest -q -m gpu tests/test_gpu.py > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$?"
tail -n 6 $OUT/gpu_tests.log
