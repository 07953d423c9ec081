#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 90 python3 benchmarks/probes/host_time.py $OUT/host C7 C4 --profile > $OUT/host_time.log 2>&1; tail -n 12 $OUT/host_time.log
timeout 60 python3 benchmarks/probes/host_overhead.py $OUT/host > $OUT/host_overhead.log 2>&1; tail -n 22 $OUT/host_overhead.log
timeout ${TEST_S:-170} python3 -m pytest -q -x -rf --durations=10 -m gpu tests/test_batch_invariant.py tests/test_poisoned.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $OUT/gpu_tests.log | head -20
timeout 130 python3 -m mla_dcp.bench --configs C1,C4,C7,R1,R2,R4 --no-baselines --out $OUT/bench > $OUT/bench.log 2>&1; tail -n 12 $OUT/bench.log
timeout 110 python3 -m mla_dcp.bench --configs C1,C4,C7,R1,R2,R4 --no-baselines --batch-invariant --out $OUT/bench_inv > $OUT/bench_inv.log 2>&1; tail -n 12 $OUT/bench_inv.log
