#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python3 benchmarks/probes/host_time.py $OUT C7 --profile > $OUT/host_time.log 2>&1; tail -n 6 $OUT/host_time.log
python3 - <<'PY' > $OUT/launch_cost.log 2>&1
import time, torch, mla_dcp
from mla_dcp import bench
from mla_dcp.ops import launchers, fast_launch, kernels
case = bench.make_case("C7", torch.bfloat16); cfg = case.cfg
seq_lens, table, q, kv, scale = case.inputs[0]
view = mla_dcp.build_view(cfg, seq_lens, table)
def t(label, f, n=3000):
    for _ in range(100): f()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): f()
    e = time.perf_counter() - s; torch.cuda.synchronize(); print(f"{label:40s} {e/n*1e6:7.2f} us", flush=True)
out = torch.empty(2, dtype=torch.int32, device="cuda")
t("fast launch row_lens_kernel", lambda: fast_launch.launch(kernels.row_lens_kernel, (1,), seq_lens, out, 2, QLEN=2, WORLD=8, RANK=0, INTERLEAVE=1, BLOCK=256, CAUSAL=True, PDL=True, launch_pdl=True))
args = (seq_lens, out, 2)
t("arg keys (3)", lambda: tuple(map(fast_launch._arg_key, args)))
opts = dict(QLEN=2, WORLD=8, RANK=0, INTERLEAVE=1, BLOCK=256, CAUSAL=True, PDL=True, launch_pdl=True)
t("options key (8)", lambda: hash(tuple(opts.items())))
t("hooked()", fast_launch._hooked)
t("launcher step_metadata", lambda: launchers.step_metadata(seq_lens, 2, 8, 0, 1, True, 64, cfg.max_pages, view.work.shape[0], 0))
seg = launchers.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, 2, 512, cfg.scale)
t("launcher segmented_attention", lambda: launchers.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, 2, 512, cfg.scale))
t("attention_outputs", lambda: launchers.attention_outputs(q, 512, view.work.shape[0], 2, False))
t("launcher merge_segments", lambda: launchers.merge_segments(*seg, view.segments, q.dtype))
t("_gluon_fits narrow", lambda: launchers._gluon_fits(1, q, kv, scale, 512, 64))
import cProfile, pstats, io
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): launchers.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, 2, 512, cfg.scale)
torch.cuda.synchronize(); pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue())
PY
head -12 $OUT/launch_cost.log
timeout 420 python3 -m pytest -q -x -rf -m gpu tests/test_gpu.py tests/test_batch_invariant.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; tail -n 4 $OUT/gpu_tests.log
