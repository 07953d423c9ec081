#!/usr/bin/env bash
# Every multi-GPU check of DCP in one go, on a machine with 2, 4 or 8 CUDA GPUs (NCCL at W = 2, 4,
# 8; the merge's cost per layer; a model across GPUs):
#   the gpu-marked distributed and Hugging Face tests (each world size skips above the GPUs here),
#   `python -m mla_dcp.bench --distributed --ranks W` for every W <= the GPU count (verify and each
#   merge method beside the collectives' bandwidth; JSON, markdown and plot per W),
#   `python -m mla_dcp hf-demo --device cuda --ranks W` (tokens against greedy generate, the per-step
#   split into attention, merge and rest on every rank) and `python -m mla_dcp demo` over NCCL ranks
#   with each merge method (mla_dcp.distributed.METHODS).
# Leaves the machine's NCCL environment as it is (NVLink multicast stays off where it is set off).
# Usage: scripts/multi_gpu.sh [OUT_DIR]   (logs land in OUT_DIR, default ./out/multi_gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-out}/multi_gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
status=0
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null || true
  env | grep -E '^NCCL_' || true
  echo "gpus $gpus"
} | tee "$out/env.txt"
if [ "$gpus" -lt 2 ]; then
  echo "scripts/multi_gpu.sh needs 2 or more CUDA GPUs, found $gpus" >&2
  exit 2
fi
python3 -m pytest -q -m gpu tests/test_distributed.py tests/test_hf.py 2>&1 | tee "$out/tests.log" || status=1
for world in 2 4 8; do
  [ "$world" -le "$gpus" ] || continue
  python3 -m mla_dcp.bench --distributed --ranks "$world" --device cuda --out "$out/bench_w$world" 2>&1 \
    | tee "$out/bench_w$world.log" || status=1
  python3 -m mla_dcp hf-demo --device cuda --ranks "$world" 2>&1 | tee "$out/hf_demo_w$world.log" || status=1
  for method in reduce_scatter all_reduce all_to_all; do
    python3 -m mla_dcp demo --device cuda --ranks "$world" --method "$method" 2>&1 \
      | tee "$out/demo_w${world}_$method.log" || status=1
  done
done
exit $status
