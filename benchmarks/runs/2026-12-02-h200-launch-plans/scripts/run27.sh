#!/usr/bin/env bash
# The gpu-marked tests from the 110th on (the first 118 passed in the previous call).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pytest -q -m gpu tests/test_gpu.py --collect-only -q 2>/dev/null | grep "::" > $OUT/ids.txt
wc -l < $OUT/ids.txt
tail -n +110 $OUT/ids.txt > $OUT/rest.txt
timeout 400 python3 -m pytest -q $(cat $OUT/rest.txt) > $OUT/gpu_tests2.log 2>&1; echo "pytest rc=$?"
tail -n 8 $OUT/gpu_tests2.log
