"""NaN in, NaN out (DESIGN.md, "Poisoned rows" and stage 5), on every path.

Each scenario poisons one input (a key a row reads, a query, a length past
the static bound) and checks every rank's partial and the merged result
against the global reference, NaN positions exactly. The same suite runs on
the CPU (pure path) and, marked ``gpu``, through each attention kernel.
"""

import contextlib
import math

import pytest
import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp.testing import (assert_close_special, check_problem, deal_positions, error_budget, make_column_positive,
                             make_problem, merge_partials, platform_fp8, poison_key, run_ranks)

SEQ_LENS = [0, 3, 45, 130]
QLEN = 3


def build(device, dtype=torch.float32, kv_dtype=None, world=2, interleave=1, num_segments=None, seed=0,
          rope_dim=8):
    if device == "cpu":
        dims = dict(num_heads=4, kv_lora_rank=32, rope_dim=rope_dim)
    else:
        dims = dict(num_heads=16, kv_lora_rank=512, rope_dim=64)
    return make_problem(SEQ_LENS, qlen=QLEN, world=world, interleave=interleave, block_size=16,
                        max_model_len=160, dtype=dtype, kv_dtype=kv_dtype or dtype, num_segments=num_segments,
                        seed=seed, device=device, **dims)


def last_position_on(problem, rank, below):
    """The last global position below ``below`` that ``rank`` holds."""
    cfg = problem.shards[0].cfg
    return max(p for p in deal_positions(problem.global_kv.shape[1], cfg.dcp_world_size, cfg.interleave)[rank]
               if p < below)


def nan_key_on_rank_1(problem):
    """A NaN key on rank 1 (rank 0 when alone) that only request 3's last row(s) see."""
    length = SEQ_LENS[3]
    rank = min(1, problem.shards[0].cfg.dcp_world_size - 1)
    position = last_position_on(problem, rank, length - QLEN + 2)
    assert poison_key(problem, 3, position, slice(None), math.nan) == rank
    return [(3 * QLEN + t, slice(None)) for t in range(QLEN) if position < length - QLEN + 1 + t]


def inf_in_rope_of_a_key(problem):
    """+inf in the rope part only: a key scoring +inf for some heads, -inf for others."""
    position = last_position_on(problem, 0, 20)
    poison_key(problem, 2, position, slice(-2, -1), math.inf)
    return [(2 * QLEN + t, slice(None)) for t in range(QLEN)]


def inf_in_a_query(problem):
    problem.q[3 * QLEN + 1, 2, 5] = math.inf
    return [(3 * QLEN + 1, 2)]


def neg_inf_query_every_score_neg_inf(problem):
    """Every score of the row is -inf: the case that used to look empty."""
    make_column_positive(problem, 0)
    problem.q[2 * QLEN, 1, 0] = -math.inf
    return [(2 * QLEN, 1)]


SCENARIOS = {
    "nan_key_on_rank_1": nan_key_on_rank_1,
    "inf_in_rope_of_a_key": inf_in_rope_of_a_key,
    "inf_in_a_query": inf_in_a_query,
    "neg_inf_query": neg_inf_query_every_score_neg_inf,
}


def run_scenario(name, problem, dtype, kv_dtype):
    poisoned = SCENARIOS[name](problem)
    _, exact_lse = problem.reference()
    # The scenario poisons what it says, and nothing else.
    want = torch.zeros_like(exact_lse, dtype=torch.bool)
    for row, heads in poisoned:
        want[row, heads] = True
    assert torch.equal(exact_lse.isnan().cpu(), want.cpu()), "the reference must poison exactly these rows"
    check_problem(problem, dtype, kv_dtype)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (3, 2)])
def test_poisoned_inputs_give_nan_rows_through_the_merge(name, world, interleave):
    problem = build("cpu", world=world, interleave=interleave)
    run_scenario(name, problem, torch.float32, None)


@pytest.mark.parametrize("name", ["nan_key_on_rank_1", "inf_in_a_query"])
def test_poisoned_inputs_on_an_fp8_cache(name):
    problem = build("cpu", dtype=torch.float16, kv_dtype=torch.float8_e4m3fn)
    run_scenario(name, problem, torch.float16, torch.float8_e4m3fn)


def test_rank_merge_keeps_the_nan_of_one_rank():
    """The field bug: rank 1 NaN, rank 0 finite; the merge returned rank 0's answer."""
    problem = build("cpu")
    rows = nan_key_on_rank_1(problem)
    partials, _ = run_ranks(problem)
    (out0, lse0), (out1, lse1) = partials
    row = rows[-1][0]
    assert bool(lse0[row].isfinite().all()) and bool(lse1[row].isnan().all())
    out, lse = merge_partials(partials)
    assert bool(out[row].isnan().all()) and bool(lse[row].isnan().all())


def partials_for(problem, seq_lens):
    partials = []
    for shard in problem.shards:
        view = mla_dcp.build_view(shard.cfg, seq_lens, shard.block_table)
        partials.append(mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale))
    return partials


def lengths_past_the_bound(problem):
    """Request 3 claims 200 tokens of a 160-token bound: all its rows NaN in
    out and lse, on every rank and after the merge; the others unchanged."""
    too_long = problem.seq_lens.clone()
    too_long[3] = 200
    want_out, want_lse = merge_partials(partials_for(problem, problem.seq_lens))
    partials = partials_for(problem, too_long)
    for out, lse in partials + [merge_partials(partials)]:
        assert bool(out[3 * QLEN:].isnan().all()) and bool(lse[3 * QLEN:].isnan().all())
    out, lse = merge_partials(partials)
    assert torch.equal(out[:3 * QLEN], want_out[:3 * QLEN]) and torch.equal(lse[:3 * QLEN], want_lse[:3 * QLEN])


def test_rows_past_the_static_bound_are_nan_in_out_and_lse():
    lengths_past_the_bound(build("cpu"))


def flashmla_style_partials(problem):
    """Our partials plus a rank that reports "no key" FlashMLA's way (+inf
    lse, 0 out) for every row: the merge must equal the one without it."""
    partials, _ = run_ranks(problem)
    out, lse = partials[0]
    flash = (torch.zeros_like(out), torch.full_like(lse, math.inf))
    want_out, want_lse = merge_partials(partials)
    got_out, got_lse = merge_partials(partials + [flash])
    assert torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse)
    # Every rank empty FlashMLA's way: 0 and -inf, never NaN.
    empty_out, empty_lse = merge_partials([flash, flash])
    assert bool((empty_out == 0).all()) and bool(empty_lse.isneginf().all())


def test_pos_inf_lse_partials_mean_no_key():
    flashmla_style_partials(build("cpu"))


# --- the Triton kernels under the interpreter (fp16: its bf16 dot is wrong) --

@pytest.mark.interpret
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("num_segments", [1, 2])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_poisoned_inputs_through_the_triton_kernels(name, num_segments, tma):
    """Each scenario through the pointer and descriptor kernels, the segment
    merge kernel and the rank merge kernel, called as launchers on CPU
    tensors; merged against the global reference, NaN positions exactly."""
    from mla_dcp.ops import launchers, tiles

    problem = build("cpu", dtype=torch.float16, num_segments=num_segments, rope_dim=16, seed=5)
    SCENARIOS[name](problem)
    plan = tiles.AttentionPlan(block_m=16, block_n=16, num_warps=4, num_stages=2, tma=tma)
    outs, lses = [], []
    with tiles.forced_plan(plan):
        for shard in problem.shards:
            cfg = shard.cfg
            row_lens = launchers.row_lens(problem.seq_lens, QLEN, cfg.dcp_world_size, cfg.dcp_rank, 1)
            pages = launchers.expand_pages(shard.block_table, cfg.block_size, cfg.max_local_len)
            batch = problem.seq_lens.shape[0]
            work, segments = launchers.schedule(row_lens, QLEN, cfg.page_size, cfg.max_pages, batch * num_segments)
            args = (problem.q, shard.kv_cache, None, row_lens, pages, work, QLEN, cfg.kv_lora_rank, cfg.scale)
            if num_segments == 1:
                out, lse = launchers.single_segment_attention(*args)
            else:
                out, lse = launchers.merge_segments(*launchers.segmented_attention(*args), segments, torch.float16)
            outs.append(out)
            lses.append(lse)
    out, lse = launchers.merge_ranks(torch.stack(outs), torch.stack(lses))
    exact_out, exact_lse = problem.reference()
    assert bool(exact_lse.isnan().any())
    budget = error_budget(exact_out, problem.reference(torch.float16)[0], torch.float16)
    assert_close_special("lse", lse, exact_lse, max(budget, 1e-3))
    assert_close_special("out", out, exact_out, budget)


# --- the GPU kernels: the same scenarios through each attention kernel ------

def _plans():
    from mla_dcp.ops import tiles

    return {
        "auto": None,
        "pointer": tiles.AttentionPlan(64, 64, 8, 2),
        "tma": tiles.AttentionPlan(64, 64, 8, 2, tma=True),
        "seesaw": tiles.AttentionPlan(64, 64, 8, 2, tma=True, seesaw=True),
        "narrow16": tiles.AttentionPlan(16, 64, 4, 2, narrow=True),
        "narrow32": tiles.AttentionPlan(32, 64, 4, 1, narrow=True),
    }


GPU_KERNELS = ["auto", "pointer", "tma", "seesaw", "narrow16", "narrow32"]


@contextlib.contextmanager
def kernel(name):
    from mla_dcp.ops import tiles

    plan = _plans()[name]
    if name in ("seesaw", "narrow16", "narrow32") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are built for sm_90")
    with tiles.forced_plan(plan) if plan else contextlib.nullcontext():
        yield


@pytest.mark.gpu
@pytest.mark.parametrize("num_segments", [None, 1])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("kernel_name", GPU_KERNELS)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_poisoned_inputs_on_the_gpu(name, kernel_name, kv, num_segments):
    kv_dtype = platform_fp8() if kv == "fp8" else None
    if kv_dtype is not None and name in ("inf_in_rope_of_a_key", "neg_inf_query"):
        pytest.skip("e4m3 holds no inf, and the positive column needs a 16-bit cache")
    problem = build("cuda", dtype=torch.bfloat16, kv_dtype=kv_dtype, num_segments=num_segments, seed=3)
    with kernel(kernel_name):
        run_scenario(name, problem, torch.bfloat16, kv_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("num_segments", [None, 1])
@pytest.mark.parametrize("kernel_name", GPU_KERNELS)
def test_rows_past_the_static_bound_on_the_gpu(kernel_name, num_segments):
    with kernel(kernel_name):
        lengths_past_the_bound(build("cuda", dtype=torch.bfloat16, num_segments=num_segments))


@pytest.mark.gpu
def test_pos_inf_lse_partials_on_the_gpu():
    flashmla_style_partials(build("cuda", dtype=torch.bfloat16))
