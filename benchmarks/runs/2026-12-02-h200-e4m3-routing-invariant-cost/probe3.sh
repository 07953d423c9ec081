#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -n 8 -m gpu tests/test_fp8_products.py tests/test_gpu.py -k "roundings or stream or narrow or seesaw" 2>&1 | tail -15 > $OUT/gpu_tests_routing.log
bash gpu_run/probe2.sh > /dev/null 2>&1
