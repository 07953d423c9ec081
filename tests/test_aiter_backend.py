"""The optional AITER backend: conversion of AITER-shaped partials, metadata, errors (CPU)."""

import math

import pytest
import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp.ops import aiter_backend
from mla_dcp.testing import assert_close_special, make_problem


def test_missing_rocm_or_aiter_is_a_clear_error_before_any_work(monkeypatch):
    problem = make_problem([5, 40], qlen=2, num_heads=4, kv_lora_rank=16, rope_dim=16)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a kernel ran before the backend was checked")
    monkeypatch.setattr(mla_dcp.api.ops, "segmented_attention", must_not_run)
    monkeypatch.setattr(mla_dcp.api.ops, "merge_segments", must_not_run)
    with pytest.raises(RuntimeError, match=r"backend='aiter' needs a ROCm build of PyTorch"):
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, backend="aiter")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    with pytest.raises(RuntimeError, match=r"pip install amd-aiter"):
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, backend="aiter")
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'aiter'\), got 'cuda'"):
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, backend="cuda")


def test_active_splits_match_the_split_rule():
    for granule in (1, 16, 64):
        for splits in (1, 3, 8):
            lens = torch.arange(0, 300, dtype=torch.int32)
            got = aiter_backend.active_splits(lens, splits, granule).tolist()
            for length, active in zip(lens.tolist(), got):
                split_len = max(granule, -(-length // splits)) if length else 1
                starts = [s * split_len for s in range(splits)]
                assert active == sum(1 for start in starts if start < length), (length, splits, granule)


def test_metadata_packs_each_rows_pages():
    page, qlen = 16, 2
    row_lens = torch.tensor([0, 1, 17, 33, 16, 0], dtype=torch.int32)
    table = torch.tensor([[7, 3, 9], [1, 5, 1 << 29], [2, 4, 6]], dtype=torch.int32)
    indptr, indices, last = aiter_backend.aiter_metadata(row_lens, table, qlen, page)
    assert indptr.tolist() == [0, 0, 1, 3, 6, 7, 7]
    packed = indices[:7].tolist()
    # row 1: page 7; row 2: pages 1, 5; row 3: 1, 5 and its third entry; row 4: page 2
    assert packed == [7, 1, 5, 1, 5, 1 << 29, 2]
    assert last.tolist() == [0, 1, 1, 1, 16, 0]


def aiter_shaped_partials(problem, shard, num_splits, granule):
    """Partials as AITER writes them, computed independently per row and split,
    with garbage (NaN, huge values) in every split AITER leaves unwritten."""
    cfg = shard.cfg
    rows, heads, width = problem.q.shape
    row_lens = pure.verify_row_lens(problem.seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave)
    logits = torch.full((rows, num_splits, heads, cfg.kv_lora_rank), math.nan)
    lse2 = torch.full((rows, num_splits, heads, 1), 1e30)
    flat_cache = shard.kv_cache.reshape(-1, width).double()
    for row in range(rows):
        length = int(row_lens[row])
        b = row // cfg.qlen
        slots = [int(shard.block_table[b, j // cfg.block_size]) * cfg.block_size + j % cfg.block_size
                 for j in range(length)]
        keys = flat_cache[slots]
        split_len = max(granule, -(-length // num_splits)) if length else 1
        for split in range(num_splits):
            lo, hi = split * split_len, min((split + 1) * split_len, length)
            if lo >= length:
                continue
            scores2 = (problem.q[row].double() @ keys[lo:hi].T) * cfg.scale * math.log2(math.e)   # [H, n]
            top = scores2.max(dim=-1, keepdim=True).values
            weights = torch.exp2(scores2 - top)
            total = weights.sum(-1, keepdim=True)
            logits[row, split] = ((weights @ keys[lo:hi, :cfg.kv_lora_rank]) / total).float()
            lse2[row, split, :, 0] = (top + torch.log2(total))[:, 0].float()
    return logits, lse2, row_lens


@pytest.mark.parametrize("num_splits,granule", [(1, 16), (4, 16), (8, 1)])
def test_converted_partials_merge_to_the_reference(num_splits, granule):
    problem = make_problem([0, 2, 37, 120], qlen=3, num_heads=4, kv_lora_rank=16, rope_dim=8, world=2,
                           interleave=2, block_size=16, max_model_len=128, seed=9)
    for rank, shard in enumerate(problem.shards):
        logits, lse2, row_lens = aiter_shaped_partials(problem, shard, num_splits, granule)
        seg = aiter_backend.partials_to_segments(logits, lse2, row_lens, granule)
        out, lse = pure.merge_stacked_segments(*seg, torch.float32)
        slotted = aiter_backend.stacked_to_slots(*seg, problem.shards[0].cfg.qlen)
        for name, got, want in zip(("slots out", "slots lse"), pure.merge_segments(*slotted, torch.float32), (out, lse)):
            assert_close_special(name, got, want, 1e-6)
        want_out, want_lse = problem.reference(rank=rank)
        assert_close_special(f"rank {rank} out", out, want_out, 1e-5)
        assert_close_special(f"rank {rank} lse", lse, want_lse, 1e-5)


def test_unwritten_splits_are_what_the_garbage_would_break():
    """Negative control: treating every split as written lets the garbage in."""
    problem = make_problem([37, 120], qlen=2, num_heads=4, kv_lora_rank=16, rope_dim=8, max_model_len=128)
    shard = problem.shards[0]
    logits, lse2, row_lens = aiter_shaped_partials(problem, shard, 8, 16)
    seg_out, _, _ = aiter_backend.partials_to_segments(logits, lse2, row_lens, 16)
    all_written = (seg_out, lse2[..., 0].transpose(1, 2), torch.ones_like(lse2[..., 0].transpose(1, 2)))
    out, _ = pure.merge_stacked_segments(*all_written, torch.float32)
    assert not torch.isfinite(out).all()
