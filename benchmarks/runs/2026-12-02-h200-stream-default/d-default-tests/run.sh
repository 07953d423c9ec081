#!/usr/bin/env bash
# The stream as the GPUs' default: every gpu-marked test, then the kernel tests with MLA_DCP_STREAM=0.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 360 python3 -m pytest -q -rf -n 12 -m gpu tests -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
echo "default rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|error" $OUT/gpu_tests.log | tail -n 15
MLA_DCP_STREAM=0 timeout 200 python3 -m pytest -q -rf -n 12 -m gpu tests/test_gpu.py tests/test_poisoned.py tests/test_noncausal.py -p no:cacheprovider > $OUT/gpu_tests_chunked.log 2>&1
echo "chunked rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|error" $OUT/gpu_tests_chunked.log | tail -n 8
