"""Stages 4 and 5: the merges and their empty-row rules."""

import math

import pytest
import torch

import mla_dcp
from mla_dcp import pure


def logsumexp_merge64(outs, lses):
    lses = lses.double()
    total = torch.logsumexp(lses, dim=0)
    return (torch.exp(lses - total)[..., None] * outs.double()).sum(0), total


def test_merge_ranks_matches_float64():
    gen = torch.Generator().manual_seed(0)
    outs = torch.randn(4, 6, 3, 8, generator=gen)
    lses = torch.randn(4, 6, 3, generator=gen) * 20
    out, lse = mla_dcp.merge_ranks(outs, lses)
    want_out, want_lse = logsumexp_merge64(outs, lses)
    assert (out.double() - want_out).abs().max() < 1e-5
    assert (lse.double() - want_lse).abs().max() < 1e-5


def test_all_ranks_empty_gives_exact_zero_and_neg_inf_with_garbage_outputs():
    outs = torch.full((3, 2, 4, 8), math.nan)
    outs[1] = math.inf
    lses = torch.full((3, 2, 4), -math.inf)
    out, lse = mla_dcp.merge_ranks(outs, lses)
    assert bool((out == 0).all())
    assert bool(lse.isneginf().all())


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_and_pos_inf_lse_mean_empty(bad):
    gen = torch.Generator().manual_seed(1)
    outs = torch.randn(3, 5, 2, 4, generator=gen)
    lses = torch.randn(3, 5, 2, generator=gen)
    poisoned_outs, poisoned_lses = outs.clone(), lses.clone()
    poisoned_outs[2] = math.nan
    poisoned_lses[2] = bad
    out, lse = mla_dcp.merge_ranks(poisoned_outs, poisoned_lses)
    want_out, want_lse = mla_dcp.merge_ranks(outs[:2], lses[:2])
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_merge_ranks_keeps_dtype():
    outs = torch.randn(2, 3, 4, 8).to(torch.bfloat16)
    out, lse = mla_dcp.merge_ranks(outs, torch.zeros(2, 3, 4))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(out, ((outs[0].float() + outs[1].float()) / 2).to(torch.bfloat16))


def test_merge_segments_empty_and_unread_garbage():
    seg_out = torch.full((2, 1, 3, 4), math.nan)
    seg_max = torch.tensor([[[-math.inf, -math.inf, -math.inf]], [[1.0, -math.inf, 3.0]]])
    seg_sum = torch.tensor([[[0.0, 0.0, 0.0]], [[2.0, 0.0, 1.0]]])
    seg_out[1, 0, 0] = 1.0
    seg_out[1, 0, 2] = 2.0
    out, lse = pure.merge_segments(seg_out, seg_max, seg_sum, torch.float32)
    assert bool((out[0] == 0).all()) and bool(lse[0].isneginf().all())
    # Z = 2 * 2^(1-3) + 1 = 1.5; out = (2^-2 * 1 + 2) / 1.5; lse = ln2 * (3 + log2 1.5)
    assert torch.allclose(out[1, 0], torch.full((4,), (0.25 + 2.0) / 1.5))
    assert math.isclose(lse[1, 0].item(), math.log(2) * (3 + math.log2(1.5)), rel_tol=1e-6)


def test_merge_segments_is_natural_log():
    """One segment holding one key with score s: LSE must be s (natural), not s*log2(e)."""
    score2 = torch.tensor([[[5.0]]])  # base-2 max of a single key
    out, lse = pure.merge_segments(torch.ones(1, 1, 1, 2), score2, torch.ones(1, 1, 1), torch.float32)
    assert math.isclose(lse.item(), 5.0 * math.log(2), rel_tol=1e-6)


def test_merge_segments_propagates_nan_statistics():
    """DESIGN stage 4: a weight is 0 only where seg_max is -inf. A NaN statistic
    (NaN data inside a row's window) must give NaN, not an empty row."""
    seg_out = torch.ones(2, 1, 3, 4)
    seg_max = torch.tensor([[[1.0, math.nan, -math.inf]], [[1.0, 2.0, -math.inf]]])
    seg_sum = torch.tensor([[[1.0, 1.0, 0.0]], [[1.0, 1.0, 0.0]]])
    out, lse = pure.merge_segments(seg_out, seg_max, seg_sum, torch.float32)
    assert bool(out[0].isnan().all()) and bool(lse[0].isnan().all())
    assert torch.allclose(out[1], torch.ones(1, 4)) and bool(lse[1].isfinite().all())


def test_nan_inside_the_window_is_loud_end_to_end():
    from mla_dcp.testing import make_problem

    problem = make_problem([20, 30], qlen=2, num_heads=4, kv_lora_rank=16, rope_dim=8, block_size=16,
                           max_model_len=32)
    shard = problem.shards[0]
    corrupted = shard.kv_cache.clone()
    corrupted[shard.block_table[1, 0], 3] = math.nan      # position 3 of request 1: every row of it sees it
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    out, lse = mla_dcp.verify(shard.cfg, view, problem.q, corrupted)
    assert bool(out[2:].isnan().all()) and bool(lse[2:].isnan().all())
    assert bool(out[:2].isfinite().all())
