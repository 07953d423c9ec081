#!/usr/bin/env bash
# Host-cost baseline (parts and primitives) and the pending stream-kernel gpu test.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks/probes
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 200 python3 gpu_run/host_parts.py C7 C4 > $OUT/host_parts.log 2>&1; echo "parts rc=$?"
cat $OUT/host_parts.log | grep -v Warn | cut -c1-200
timeout 200 python3 -m pytest -q -x -m gpu tests/test_gpu.py -k "few_long or stream" > $OUT/gpu_stream.log 2>&1; echo "pytest rc=$?"
tail -n 8 $OUT/gpu_stream.log
