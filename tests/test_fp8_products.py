"""VerifyConfig(fp8_products=True): e4m3 products over an e4m3 cache.

The pure path applies the kernels' roundings (q's latent part per (row,
head), P per 64-token KV tile against the running max); the Triton kernels
are checked against it under the interpreter (with torch's e4m3 rounding:
the interpreter's own fp32 -> e4m3 conversion drops the carry into the
exponent, 1.94 -> 1.0) and on the GPU (tests/test_gpu.py's style, marked gpu).
"""

import dataclasses
import math

import pytest
import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp._shapes import FP8_P_SCALE, FP8_PRODUCTS_TILE
from mla_dcp.testing import assert_close_special, make_problem, poison_key

E4M3 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(E4M3 is None, reason="this torch has no float8_e4m3fn")


def _problem(lens=(300, 130, 1), qlen=2, heads=8, dl=64, dr=16, block=16, dtype=torch.float16, seed=3,
             device="cpu", scale=0.2):
    return make_problem(list(lens), qlen=qlen, num_heads=heads, kv_lora_rank=dl, rope_dim=dr, block_size=block,
                        dtype=dtype, kv_dtype=E4M3, seed=seed, softmax_scale=scale, device=device)


def _errors(out, lse, ref_out, ref_lse):
    d = out.double() - ref_out
    return (d.norm() / ref_out.norm()).item(), (lse.double() - ref_lse).abs().max().item()


def test_row_factor_puts_every_row_in_128_256_even_one_ulp_below_a_power_of_two():
    # A float32 log2 of one ulp below 2^k rounds to k: floor(log2) then left such rows in [64, 128).
    powers = torch.tensor([2.0 ** k for k in range(-100, 100)])
    amax = torch.cat([powers, torch.nextafter(powers, torch.tensor(0.0)), powers * 1.5])
    factor, unscale = pure.e4m3_row_factor(amax)
    scaled = amax * factor
    assert ((scaled >= 128) & (scaled < 256)).all(), amax[(scaled < 128) | (scaled >= 256)]
    assert torch.equal(factor * unscale, torch.ones_like(factor))


def test_config_refuses_what_the_mode_cannot_run():
    problem = _problem()
    shard = problem.shards[0]
    with pytest.raises(ValueError, match="fp8_products must be a bool"):
        dataclasses.replace(shard.cfg, fp8_products=1)
    cfg = dataclasses.replace(shard.cfg, fp8_products=True)
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
    half_cache = shard.kv_cache.float().half()
    with pytest.raises(ValueError, match=r"fp8_products=True needs a torch.float8_e4m3fn kv_cache.*float16"):
        mla_dcp.verify(cfg, view, problem.q, half_cache)
    with pytest.raises(ValueError, match="fp8_products=True needs backend='auto'"):
        mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale, backend="aiter")


def test_row_factor_puts_each_row_in_e4m3_range_and_keeps_inf_poisoned():
    amax = torch.tensor([3.7e-3, 1.0, 255.9, 448.0, 6.0e4, 0.0, math.inf, math.nan, 1e-45])
    factor, unscale = pure.e4m3_row_factor(amax)
    scaled = amax[:5] * factor[:5]
    assert ((scaled >= 128) & (scaled < 256)).all(), scaled
    assert torch.equal(torch.log2(factor), torch.log2(factor).round())             # powers of two: exact
    assert factor[5] == 1 and factor[6] == 1 and factor[7] == 1
    assert torch.isnan(unscale[6]) and torch.isfinite(unscale[:6]).all()
    assert torch.isfinite(factor).all() and torch.isfinite(unscale[8])


def _online_weights(scores: torch.Tensor) -> torch.Tensor:
    """The kernels' loop, tile by tile: P quantised against the running max,
    the accumulator rescaled by alpha; returns each key's final weight
    relative to the segment's max (what multiplies its value)."""
    n = scores.shape[-1]
    m = torch.full(scores.shape[:-1], -math.inf, dtype=torch.float64)
    acc = torch.zeros(scores.shape, dtype=torch.float64)     # acc of one-hot values: the weight per key
    for start in range(0, n, FP8_PRODUCTS_TILE):
        s = scores[..., start:start + FP8_PRODUCTS_TILE].double()
        m_new = torch.maximum(m, s.amax(-1))
        shift = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp2(s - shift[..., None])
        alpha = torch.exp2(m - shift)
        acc = acc * alpha[..., None]
        p8 = pure.to_e4m3((p * FP8_P_SCALE).float()).double() / FP8_P_SCALE
        acc[..., start:start + FP8_PRODUCTS_TILE] = p8
        m = m_new
    return acc


def test_tile_weights_equal_the_kernels_online_loop():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 3, 300, generator=gen) * 6
    scores[0, 0, 70:] = -math.inf                  # a row whose keys end inside the second tile
    scores[1, 1, :130] = -math.inf                 # nothing visible in the first tiles
    scores[2] += torch.linspace(0, 40, 300)        # the max rises tile after tile
    scores[3, 2] = -math.inf                       # an empty row
    top = scores.amax(-1)
    got = pure.fp8_product_weights(scores, top)
    want = _online_weights(scores)
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=0), (got.double() - want).abs().max()
    assert (got[3, 2] == 0).all() and (got[1, 1, :130] == 0).all()
    # Quantised, not exact: the mode's weights are not exp2(s - top).
    assert not torch.allclose(got, torch.exp2(scores - top[..., None]), rtol=1e-3)


def test_pure_mode_rounds_and_stays_within_its_error_band():
    problem = _problem(lens=(3000, 1500, 700), qlen=3, heads=8, dl=512, dr=64, block=64, dtype=torch.bfloat16,
                       seed=1, scale=192 ** -0.5)
    shard = problem.shards[0]
    ref_out, ref_lse = problem.reference(torch.float64)
    errors = {}
    for mode in (False, True):
        cfg = dataclasses.replace(shard.cfg, fp8_products=mode)
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
        out, lse = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
        errors[mode] = _errors(out, lse, ref_out, ref_lse)
    # Gaussian q and keys at DeepSeek's widths (measured: exact 1.6e-3, fp8 products 4.0e-2):
    # the e4m3 rounding of q dominates; far above the exact mode, far below noise.
    assert errors[False][0] < 5e-3 and 1.5e-2 < errors[True][0] < 8e-2, errors


@pytest.mark.interpret
@pytest.mark.parametrize("heads,block,kernel", [(8, 16, "segmented_attention_kernel"),
                                                (32, 64, "segmented_attention_tma_kernel")])
def test_triton_kernels_apply_the_pure_roundings(exact_e4m3_interpreter, monkeypatch, heads, block, kernel):
    from mla_dcp.ops import launchers
    problem = _problem(heads=heads, block=block)
    poison_key(problem, 0, 37, slice(3, 4), math.nan)            # a NaN key: its rows poisoned
    shard = problem.shards[0]
    cfg = dataclasses.replace(shard.cfg, fp8_products=True, num_segments=2)
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
    launched = []
    launch = launchers.launch
    monkeypatch.setattr(launchers, "launch", lambda k, *a, **kw: (launched.append((k.__name__, kw)), launch(k, *a, **kw))[1])
    got = launchers.segmented_attention(problem.q, shard.kv_cache, problem.kv_scale, view.row_lens,
                                        view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank, cfg.scale, 0, True)
    assert [(name, kw["FP8_PRODUCTS"], kw["BLOCK_N"], kw["Q_TO_FP16"]) for name, kw in launched] == [
        (kernel, True, FP8_PRODUCTS_TILE, False)]
    common = dict(qlen=cfg.qlen, kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale, kv_scale=problem.kv_scale)
    args = (problem.q, shard.kv_cache, view.row_lens, view.page_table, view.work)
    want = pure.segmented_attention(*args, fp8_products=True, **common)
    exact = pure.segmented_attention(*args, **common)
    assert torch.isnan(want[1]).any()
    for name, g, w, e in zip(("seg_out", "seg_max", "seg_sum"), got, want, exact):
        rounding = (w - e)[torch.isfinite(w)].abs().max().item()     # what the mode's roundings change
        err = assert_close_special(name, torch.where(want[2][..., None] > 0, g, 0) if name == "seg_out" else g,
                                   torch.where(want[2][..., None] > 0, w, 0) if name == "seg_out" else w,
                                   atol=1e-4 * max(1.0, w[torch.isfinite(w)].abs().max().item()))
        assert err < rounding / 100, (name, err, rounding)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lens,qlen,heads,block,dtype,seesaw", [
    ((700, 2000, 130, 1), 4, 16, 64, torch.bfloat16, None),      # 64 pairs: TMA kernel (a seesaw on Hopper)
    ((700, 2000, 130), 3, 128, 64, torch.bfloat16, True),        # C2's heads: the seesaw on Hopper
    ((700, 2000, 131, 45), 3, 128, 16, torch.float16, True),     # pages of 16 tokens, fp16 q
    ((300, 90, 1500), 2, 8, 16, torch.bfloat16, False),          # pointer kernel
    # 32 pairs over four requests: the seesaw where the GPU's tuned 64-row e4m3 plan is one (the H200's);
    # two requests: too few programs for it, the Triton kernel.
    ((700, 2000, 130, 900), 2, 16, 64, torch.bfloat16, "tuned"),
    ((1900, 700), 2, 16, 64, torch.bfloat16, False)])
def test_gpu_kernels_apply_the_pure_roundings(monkeypatch, lens, qlen, heads, block, dtype, seesaw):
    from mla_dcp.ops import launchers, tiles
    if seesaw == "tuned":
        seesaw = (tiles._tuned(64, 512, dtype, torch.float8_e4m3fn, block, torch.device("cuda")) or {}).get(
            "seesaw", False)
    problem = _problem(lens=lens, qlen=qlen, heads=heads, dl=512, dr=64, block=block, dtype=dtype,
                       seed=5, device="cuda", scale=192 ** -0.5)
    poison_key(problem, 0, 37, slice(3, 4), math.nan)
    shard = problem.shards[0]
    cfg = dataclasses.replace(shard.cfg, fp8_products=True)
    hopper = launchers._gluon_modules() is not None and torch.cuda.get_device_capability() == (9, 0)
    seesaw_launches = []
    if hopper:
        module = launchers._gluon_modules()[0]
        launch = module.launch
        monkeypatch.setattr(module, "launch", lambda *a, **kw: (seesaw_launches.append(kw), launch(*a, **kw))[1])
    # The view for these dtypes: its schedule follows the kernel they take (the seesaw's one piece a program).
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table, q_dtype=dtype, kv_dtype=shard.kv_cache.dtype)
    out, lse = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    if hopper and seesaw is not None:
        # The seesaw's e4m3 build serves the 64-row tiles; the others keep the Triton kernels.
        assert [kw.get("fp8_products") for kw in seesaw_launches] == ([True] if seesaw else [])
    cpu = lambda t: t.cpu()  # noqa: E731
    model = pure.merge_segments(*pure.segmented_attention(
        cpu(problem.q), cpu(shard.kv_cache), cpu(view.row_lens), cpu(view.page_table), cpu(view.work),
        qlen=cfg.qlen, kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale, kv_scale=cpu(problem.kv_scale),
        fp8_products=True), cpu(view.segments), problem.q.dtype)
    ref_out, ref_lse = (t.cpu() for t in problem.reference(torch.float64))
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(model[0])) and torch.isnan(out).any()
    live = ~torch.isnan(ref_out) & ~torch.isnan(model[0])
    ok_rows = live.all(dim=-1) & torch.isfinite(ref_lse)     # rows with keys, not poisoned
    kernel_err = (out.cpu().double() - ref_out)[live].norm() / ref_out[live].norm()
    model_err = (model[0].double() - ref_out)[live].norm() / ref_out[live].norm()
    assert kernel_err <= 2 * model_err, (kernel_err, model_err)
    assert (lse.cpu().double() - ref_lse)[ok_rows].abs().max() <= 2 * (model[1].double() - ref_lse)[ok_rows].abs().max()
    # Same roundings: the kernel sits far closer to the model than either to float64.
    gap = (out.cpu().double() - model[0].double())[live].norm() / ref_out[live].norm()
    assert gap < model_err / 4, (gap, model_err)
    # And under a CUDA graph, bit for bit the eager call.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_out.nan_to_num(7.0), out.nan_to_num(7.0)) and torch.equal(g_lse.nan_to_num(7.0),
                                                                                     lse.nan_to_num(7.0))
