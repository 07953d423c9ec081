"""The step's work schedule (DESIGN.md stage 3, "Segments"): properties, and the kernel against the oracle."""

import importlib.util
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mla_dcp
from mla_dcp import pure


def cdiv(a, b):
    return -(-a // b)


def best_chunk(pages, num_items):
    """Brute force: the smallest chunk with sum max(1, cdiv(n, c)) <= num_items."""
    return next(c for c in range(1, max(pages + [1]) + 1) if sum(max(1, cdiv(n, c)) for n in pages) <= num_items)


@st.composite
def steps(draw):
    qlen = draw(st.integers(1, 4))
    page = draw(st.sampled_from([1, 16, 64]))
    max_pages = draw(st.integers(1, 300))
    batch = draw(st.integers(0, 9))
    lens = draw(st.lists(st.integers(0, max_pages * page + 3 * page), min_size=batch, max_size=batch))
    per_request = draw(st.integers(1, 12))
    rows = torch.tensor([max(0, n - qlen + 1 + t) for n in lens for t in range(qlen)], dtype=torch.int32)
    return rows, qlen, page, max_pages, batch * per_request


@settings(max_examples=300, deadline=None)
@given(steps())
def test_every_page_once_no_segment_across_requests_balanced(step):
    row_lens, qlen, page, max_pages, num_items = step
    work, segments = pure.build_schedule(row_lens, qlen, page, max_pages, num_items)
    batch = row_lens.shape[0] // qlen
    assert work.shape == (num_items, 3) and segments.shape == (batch, 2)
    assert work.dtype == segments.dtype == torch.int32
    pages = [min(cdiv(int(row_lens[b * qlen + qlen - 1]), page), max_pages) for b in range(batch)]
    chunk = best_chunk(pages, num_items) if batch else 1
    owner = [None] * num_items
    for b in range(batch):
        first, count = segments[b].tolist()
        assert 1 <= count <= num_items
        covered = []
        for item in range(first, first + count):
            request, lo, hi = work[item].tolist()
            assert request == b and owner[item] is None, "an item belongs to one request's one segment"
            owner[item] = b
            assert hi - lo <= chunk, "no item above the balanced share"
            covered += range(lo, hi)
        assert covered == list(range(pages[b])), "every page of the request once, in order"
    for item, who in enumerate(owner):
        if who is None:
            assert work[item].tolist() == [0, 0, 0], "unused items are empty"
    if batch:
        # The share is the least that fits: one page less would need more items than there are.
        assert chunk == 1 or sum(max(1, cdiv(n, chunk - 1)) for n in pages) > num_items


def test_one_long_request_among_short_ones_is_spread():
    """R4's shape: 131072 tokens beside seven of 2000 (64-token pages); the
    long one gets most items, the short ones one each."""
    lens = [131072] + [2000] * 7
    rows = torch.tensor([n - 4 + 1 + t for n in lens for t in range(4)], dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 4, 64, 2048, 8 * 8)
    counts = segments[:, 1].tolist()
    assert counts[1:] == [1] * 7 and counts[0] == 57
    spans = (work[:, 2] - work[:, 1]).tolist()
    assert max(spans) == 36 and sum(spans) == 2048 + 7 * 32


def test_uniform_lengths_split_evenly():
    rows = torch.tensor([8192] * 12, dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 3, 64, 128, 4 * 4)
    assert segments[:, 1].tolist() == [4] * 4 and set((work[:, 2] - work[:, 1]).tolist()) == {32}


def test_the_view_carries_the_schedule_and_verify_reads_it(monkeypatch):
    """verify consumes the view's schedule: a schedule that drops a request's
    last segment changes the answer (so nothing recomputes it)."""
    from mla_dcp.testing import make_problem

    problem = make_problem([5, 90], qlen=2, num_heads=2, kv_lora_rank=8, rope_dim=8, block_size=16,
                           max_model_len=96, num_segments=3)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    out, lse = mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache)
    segments = view.segments.clone()
    segments[1, 1] -= 1
    cut = mla_dcp.verify(shard.cfg, view._replace(segments=segments), problem.q, shard.kv_cache)
    assert torch.equal(cut[0][:2], out[:2]) and not torch.allclose(cut[1][2:], lse[2:])


@pytest.mark.interpret
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs under Triton's interpreter only")
@settings(max_examples=40, deadline=None)
@given(steps())
def test_the_schedule_kernel_equals_the_oracle(step):
    from mla_dcp.ops import launchers

    row_lens, qlen, page, max_pages, num_items = step
    got = launchers.schedule(row_lens, qlen, page, max_pages, num_items)
    want = pure.build_schedule(row_lens, qlen, page, max_pages, num_items)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
