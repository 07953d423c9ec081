#!/usr/bin/env bash
# gpu-marked tests of the tree after the kernel layout move, spread over processes on one GPU
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
timeout 540 python3 -m pytest -q -rf -n 8 -m gpu tests/test_gpu.py tests/test_batch_invariant.py tests/test_noncausal.py tests/test_poisoned.py tests/test_hf.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
tail -n 25 $OUT/gpu_tests.log
