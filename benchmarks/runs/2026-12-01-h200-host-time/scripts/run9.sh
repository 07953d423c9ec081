#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 80 python3 gpu_run/fastcheck.py C7 C4 R1 C2 C3 R4 > $OUT/fastcheck.log 2>&1; tail -n 8 $OUT/fastcheck.log
timeout 100 python3 benchmarks/probes/host_time.py $OUT/host C7 C4 R1 --profile > $OUT/host_time.log 2>&1; tail -n 15 $OUT/host_time.log
timeout 50 python3 benchmarks/probes/host_overhead.py $OUT/host > $OUT/host_overhead.log 2>&1; tail -n 22 $OUT/host_overhead.log
timeout 60 python3 -m pytest -q -x -m gpu tests/test_gpu.py -k "opcheck or compiled or capture or dependent or syncs or direct_launch or one_segment" -p no:cacheprovider > $OUT/gpu_quick.log 2>&1; tail -n 3 $OUT/gpu_quick.log
timeout 150 python3 -m mla_dcp.bench --configs C1,C4,C7,R1,R2,R4 --no-baselines --out $OUT/bench > $OUT/bench.log 2>&1; tail -n 9 $OUT/bench.log
