"""The Gluon kernels vs the Triton kernels, side by side on the GPU.

    python scripts/seesaw_probe.py OUT_DIR [C1,C3,C5] [seesaw|narrow32|narrow16,...]

The third argument names the Gluon kernels to check and time (default the
seesaw; ``narrowN`` is ops/narrow.py at N rows per tile).

1. Correctness against the Triton descriptor kernel (itself tested against
   the oracle): ragged lengths (partial tiles, odd tile counts, empty
   segments), NaN-poisoned slots past every length, partial m tiles; both
   the partials (merged) and the one-segment normalised path. inf/NaN
   positions must match exactly; finite values within a bound derived from
   bf16's unit roundoff times the outputs' scale.
2. Attention alone under a CUDA graph, per config: the kernel verify's plan
   picks (before the seesaw: the Triton kernel) at verify's segment count,
   then the seesaw kernel at several segment counts, and a baseline version
   of it where SEESAW_BASELINE names one.

Variants of a kernel run through both steps as kernels of their own:
SEESAW_VARIANT[2-4]=file -> "var-seesaw", "var2-seesaw", ...;
NARROW_BASELINE / NARROW_VARIANT=file -> "base-narrowN" / "var-narrowN".
PROBE_COUNTS=tuned times only verify's segment count; PROBE_EDGE=0 skips
the edge cases, PROBE_EDGE_SKIP=k1,k2 skips them for kernels already checked;
PROBE_EXTRA adds shapes (see below); PROBE_EDGE_KV=bf16,fp8 runs the edge
cases on e4m3 caches too (narrow kernels and candidates like
benchmarks/candidates/halves.py: NARROW_VARIANT=... kernel var-narrow64).
Writes OUT_DIR/seesaw_probe.json.
"""
import importlib.util
import json
import os
import pathlib
import sys
import traceback

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp._shapes import page_size_for
from mla_dcp.ops import launchers, narrow, seesaw
from mla_dcp.ops import library as ops
from mla_dcp.testing import platform_fp8


# An earlier version of ops/seesaw.py to time side by side, e.g. the first one
# (run k): `git show dbf49e3:mla_dcp/ops/seesaw.py > base.py; SEESAW_BASELINE=base.py ...`
def _module_from(env):
    if not os.environ.get(env):
        return None
    spec = importlib.util.spec_from_file_location(env.lower(), os.environ[env])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


seesaw_v1 = _module_from("SEESAW_BASELINE")
# The same for ops/narrow.py, timed as kernel "base-narrowN" (and a second
# file as "var-narrowN", e.g. a variant with one stage removed):
# `git show HEAD:mla_dcp/ops/narrow.py > base_narrow.py; NARROW_BASELINE=base_narrow.py ...`
narrow_modules = {"base-narrow": _module_from("NARROW_BASELINE"), "var-narrow": _module_from("NARROW_VARIANT"),
                  "narrow": narrow}
# Variants of ops/seesaw.py, timed (and checked) as kernels "var-seesaw",
# "var2-seesaw", "var3-seesaw" next to the committed "seesaw".
seesaw_modules = {"seesaw": seesaw, "var-seesaw": _module_from("SEESAW_VARIANT"),
                  "var2-seesaw": _module_from("SEESAW_VARIANT2"), "var3-seesaw": _module_from("SEESAW_VARIANT3"),
                  "var4-seesaw": _module_from("SEESAW_VARIANT4")}

# PROBE_EXTRA="NAME=B,q,H,L,block,kv;...": shapes beside the configs,
# e.g. C6 with 64-token blocks to see what its 16-token pages cost.
for spec in filter(None, os.environ.get("PROBE_EXTRA", "").split(";")):
    extra_name, dims = spec.split("=")
    *sizes, kv_kind = dims.split(",")
    bench.CONFIGS[extra_name] = (*map(int, sizes), kv_kind)

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["C1", "C3", "C5"]
kernels = sys.argv[3].split(",") if len(sys.argv) > 3 else ["seesaw"]
result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "checks": [], "rows": []}


def save():
    (out_dir / "seesaw_probe.json").write_text(json.dumps(result, indent=1))


def run_seesaw(q, kv, view, cfg, ns, finalize, module=seesaw, kernel="seesaw", kv_scale=None):
    page = page_size_for(kv.shape[1])
    outs = launchers.attention_outputs(q, cfg.kv_lora_rank, ns, finalize)
    family = kernel.rstrip("0123456789")
    if family in narrow_modules:
        narrow_modules[family].launch(q, kv, kv_scale, view.row_lens, view.page_table, cfg.qlen, cfg.kv_lora_rank,
                                      ns, cfg.scale, outs, finalize, page, int(kernel[len(family):]))
    else:
        module = seesaw_modules.get(kernel, module)
        # A scale only where there is one: seesaw versions from before e4m3 (baselines) take none.
        scale_arg = {} if kv_scale is None else {"kv_scale": kv_scale}
        module.launch(q, kv, view.row_lens, view.page_table, cfg.qlen, cfg.kv_lora_rank, ns, cfg.scale, outs,
                      finalize, page, **scale_arg)
    return outs


def compare(tag, got, ref, scale_ref):
    got, ref = got.float(), ref.float()
    same_nan = torch.equal(torch.isnan(got), torch.isnan(ref))
    same_inf = torch.equal(torch.isinf(got), torch.isinf(ref)) and torch.equal(got[torch.isinf(got)],
                                                                               ref[torch.isinf(ref)])
    fin = torch.isfinite(ref) & torch.isfinite(got)
    err = (got[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    # Both round probabilities to bf16 (at different maxima): a few units of
    # bf16 roundoff (2^-8) of the largest output.
    bound = 4 * 2.0 ** -8 * scale_ref
    ok = same_nan and same_inf and err <= bound
    result["checks"].append({"tag": tag, "ok": ok, "same_nan": same_nan, "same_inf": same_inf, "max_err": err,
                             "bound": bound})
    print(f"{tag}: ok={ok} nan={same_nan} inf={same_inf} err={err:.3g} bound={bound:.3g}", flush=True)
    return ok


def edge_case(seed, batch, qlen, heads, block, ns, kernel, kv_kind="bf16"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    world = 1
    max_len = 64 * 40
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=max_len,
                               dcp_world_size=world, dcp_rank=0, kv_lora_rank=512, rope_dim=64,
                               softmax_scale=192 ** -0.5)
    seq_lens = torch.randint(qlen, max_len + 1, (batch,), generator=g, device="cuda", dtype=torch.int32)
    seq_lens[0] = qlen            # nearly empty
    seq_lens[-1] = max_len        # full
    blocks_per = max_len // block
    table = torch.randperm(batch * blocks_per, generator=g, device="cuda").to(torch.int32).view(batch, -1)
    q = torch.randn(batch * qlen, heads, 576, generator=g, device="cuda").to(torch.bfloat16)
    kv = torch.randn(batch * blocks_per, block, 576, generator=g, device="cuda").to(torch.bfloat16)
    # Poison every slot past each request's length.
    for b in range(batch):
        n = int(seq_lens[b])
        for j in range(blocks_per):
            lo = j * block
            if lo + block > n:
                kv[table[b, j].long(), max(0, n - lo):] = float("nan")
    scale = None
    if kv_kind == "fp8":   # the same values as an e4m3 cache with a scale (NaN stays NaN)
        scale = torch.full((1,), 1 / 16, device="cuda")
        kv = (kv.float() / scale).to(platform_fp8())
    view = mla_dcp.build_view(cfg, seq_lens, table)
    ref = ops.segmented_attention(q, kv, scale, view.row_lens, view.page_table, qlen, 512, ns, cfg.scale)
    ref_out, ref_lse = ops.merge_segments(*ref, torch.bfloat16)
    got = run_seesaw(q, kv, view, cfg, ns, False, kernel=kernel, kv_scale=scale)
    got_out, got_lse = ops.merge_segments(*got, torch.bfloat16)
    tag = f"{kernel} edge seed={seed} B={batch} q={qlen} H={heads} block={block} ns={ns} kv={kv_kind}"
    s = ref_out.float().abs().nan_to_num(0).max().item()
    ok = compare(tag + " out", got_out, ref_out, s) & compare(tag + " lse", got_lse, ref_lse, 64.0)
    ref1 = ops.single_segment_attention(q, kv, scale, view.row_lens, view.page_table, qlen, 512, cfg.scale)
    got1 = run_seesaw(q, kv, view, cfg, 1, True, kernel=kernel, kv_scale=scale)
    ok &= compare(tag + " final out", got1[0], ref1[0], s) & compare(tag + " final lse", got1[1], ref1[1], 64.0)
    return ok


all_ok = True
# PROBE_EDGE=0 skips the edge cases (kernels unchanged since a run that passed them).
edge_cases = [] if os.environ.get("PROBE_EDGE") == "0" else [
    (4, 3, 128, 64, 3), (5, 2, 16, 64, 2), (3, 4, 64, 128, 5), (6, 1, 64, 64, 1), (2, 3, 128, 64, 7),
    (4, 3, 128, 16, 3), (3, 2, 64, 32, 4)]
# PROBE_EDGE_SKIP=k1,k2: kernels whose edge cases passed in an earlier run.
edge_skip = set(os.environ.get("PROBE_EDGE_SKIP", "").split(","))
# PROBE_EDGE_KV=bf16,fp8: cache dtypes of the edge cases (fp8: e4m3 with a scale; narrow kernels and
# seesaw variants that read e4m3, such as benchmarks/candidates/seesaw_e4m3.diff).
edge_kinds = os.environ.get("PROBE_EDGE_KV", "bf16").split(",")
for seed, (batch, qlen, heads, block, ns) in enumerate(edge_cases):
    for kernel, kv_kind in ((k, kind) for k in kernels if k not in edge_skip for kind in edge_kinds):
        try:
            all_ok &= edge_case(seed, batch, qlen, heads, block, ns, kernel, kv_kind)
        except Exception:
            traceback.print_exc()
            result["checks"].append({"tag": f"{kernel} edge {seed}", "ok": False,
                                     "error": traceback.format_exc()[-2000:]})
            all_ok = False
        save()
result["all_ok"] = all_ok
save()

for name in names:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    ns_tuned = mla_dcp.num_segments_for(cfg, case.inputs[0][1].shape[0], torch.device("cuda"), torch.bfloat16,
                                        torch.bfloat16)
    floor = max(case.kv_bytes / result["ceilings"]["copy_bytes_per_s"],
                case.flops / result["ceilings"]["bf16_flops_per_s"])
    triton_s = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case))))
    row = {"config": name, "floor_us": floor * 1e6, "ns_tuned": ns_tuned, "triton_us": triton_s * 1e6}
    print(f"{name}: floor {floor*1e6:.0f} us, triton attn {triton_s*1e6:.0f} us (ns={ns_tuned})", flush=True)
    views = [(mla_dcp.build_view(cfg, s, t), q, kv, sc) for s, t, q, kv, sc in case.inputs]
    # correctness on the real config too
    v, q, kv, sc = views[0]
    ref = ops.merge_segments(*ops.segmented_attention(q, kv, sc, v.row_lens, v.page_table, cfg.qlen, 512,
                                                      ns_tuned, cfg.scale), torch.bfloat16)[0]
    counts = {"C5": {16, 24, 32, 48, 64}, "C4": {2, 3, 4, 6}, "C2": {1, 2, 3, 4}, "C6": {1, 2}, "C7": {16, 32, 64}}.get(
        name, {1, 2, 3, 4, 6, 8})
    # PROBE_COUNTS=tuned: only the count verify's plan picks (variants of one kernel).
    if os.environ.get("PROBE_COUNTS") == "tuned":
        counts = set()
    for kernel in kernels:
        got = ops.merge_segments(*run_seesaw(q, kv, v, cfg, ns_tuned, False, kernel=kernel, kv_scale=sc),
                                 torch.bfloat16)[0]
        row.setdefault("checks", {})[kernel] = compare(f"{kernel} {name} ns={ns_tuned}", got, ref,
                                                       ref.float().abs().max().item())
        for ns in sorted(counts | {ns_tuned}):
            fin = ns == 1
            fns = [lambda v=v, q=q, kv=kv, sc=sc, ns=ns, fin=fin: run_seesaw(q, kv, v, cfg, ns, fin, kernel=kernel,
                                                                             kv_scale=sc)
                   for v, q, kv, sc in views]
            try:
                t = bench.time_fn(bench._rotating(bench._graphed(fns)))
                row.setdefault(kernel, {})[ns] = t * 1e6
                print(f"  {kernel} ns={ns}: {t*1e6:.0f} us = {t/floor:.2f}x floor ({triton_s/t:.2f}x faster)",
                      flush=True)
            except Exception:
                traceback.print_exc()
                row.setdefault(kernel, {})[ns] = None
            save()
    for ns in sorted({ns_tuned, 1} if name != "C5" else {ns_tuned}) if seesaw_v1 else []:
        fin = ns == 1
        fns = [lambda v=v, q=q, kv=kv, ns=ns, fin=fin: run_seesaw(q, kv, v, cfg, ns, fin, seesaw_v1)
               for v, q, kv, _ in views]
        t = bench.time_fn(bench._rotating(bench._graphed(fns)))
        row.setdefault("seesaw_v1", {})[ns] = t * 1e6
        print(f"  seesaw_v1 ns={ns}: {t*1e6:.0f} us = {t/floor:.2f}x floor", flush=True)
        save()
    result["rows"].append(row)
    save()
