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


def test_pos_inf_lse_means_empty():
    """+inf is another kernel's "no key" (FlashMLA's): dropped like -inf,
    whatever that rank's output holds."""
    gen = torch.Generator().manual_seed(1)
    outs = torch.randn(3, 5, 2, 4, generator=gen)
    lses = torch.randn(3, 5, 2, generator=gen)
    flash_outs, flash_lses = outs.clone(), lses.clone()
    flash_outs[2] = 0.0
    flash_outs[2, 0] = math.nan
    flash_lses[2] = math.inf
    out, lse = mla_dcp.merge_ranks(flash_outs, flash_lses)
    want_out, want_lse = mla_dcp.merge_ranks(outs[:2], lses[:2])
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_nan_lse_poisons_the_merged_row_whatever_the_others_hold():
    """DESIGN stage 5: a NaN partial is never dropped."""
    gen = torch.Generator().manual_seed(1)
    outs = torch.randn(3, 5, 2, 4, generator=gen)
    lses = torch.randn(3, 5, 2, generator=gen)
    lses[:, 1] = -math.inf          # row 1: empty on ranks 0 and 2, poisoned on rank 1
    lses[1, 1:3, 0] = math.nan      # rows 1-2, head 0: poisoned on rank 1
    lses[2, 2, 0] = math.inf        # ... with a FlashMLA-style empty partial beside it
    out, lse = mla_dcp.merge_ranks(outs, lses)
    poisoned = torch.zeros(5, 2, dtype=torch.bool)
    poisoned[1:3, 0] = True
    assert torch.equal(lse.isnan(), poisoned)
    assert torch.equal(out.isnan().all(-1), poisoned) and not bool(out[~poisoned].isnan().any())
    want_out, want_lse = mla_dcp.merge_ranks(outs[:, 3:], lses[:, 3:])
    assert torch.equal(out[3:], want_out) and torch.equal(lse[3:], want_lse)


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
    out, lse = pure.merge_stacked_segments(seg_out, seg_max, seg_sum, torch.float32)
    assert bool((out[0] == 0).all()) and bool(lse[0].isneginf().all())
    # Z = 2 * 2^(1-3) + 1 = 1.5; out = (2^-2 * 1 + 2) / 1.5; lse = ln2 * (3 + log2 1.5)
    assert torch.allclose(out[1, 0], torch.full((4,), (0.25 + 2.0) / 1.5))
    assert math.isclose(lse[1, 0].item(), math.log(2) * (3 + math.log2(1.5)), rel_tol=1e-6)


def test_merge_segments_is_natural_log():
    """One segment holding one key with score s: LSE must be s (natural), not s*log2(e)."""
    score2 = torch.tensor([[[5.0]]])  # base-2 max of a single key
    out, lse = pure.merge_stacked_segments(torch.ones(1, 1, 1, 2), score2, torch.ones(1, 1, 1), torch.float32)
    assert math.isclose(lse.item(), 5.0 * math.log(2), rel_tol=1e-6)


def test_merge_segments_reads_pos_inf_statistics_as_poison():
    """Stage 3 never writes +inf; a +inf max from elsewhere is not a key."""
    seg_max = torch.tensor([[[1.0, math.inf, -math.inf]]])
    out, lse = pure.merge_stacked_segments(torch.ones(1, 1, 3, 4), seg_max, torch.ones(1, 1, 3), torch.float32)
    assert bool(out.isnan().all()) and bool(lse.isnan().all())


def test_merge_segments_propagates_nan_statistics():
    """DESIGN stage 4: a weight is 0 only where seg_max is -inf. A NaN statistic
    (NaN data inside a row's window) must give NaN, not an empty row."""
    seg_out = torch.ones(2, 1, 3, 4)
    seg_max = torch.tensor([[[1.0, math.nan, -math.inf]], [[1.0, 2.0, -math.inf]]])
    seg_sum = torch.tensor([[[1.0, 1.0, 0.0]], [[1.0, 1.0, 0.0]]])
    out, lse = pure.merge_stacked_segments(seg_out, seg_max, seg_sum, torch.float32)
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
