"""The step's work schedule (DESIGN.md stage 3, "Segments"): properties, and the kernel against the oracle."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mla_dcp
from mla_dcp import pure

try:
    import triton
    import triton.language as tl

    from mla_dcp.ops.triton_kernels import kernels as triton_kernels
except ImportError:   # Triton is optional: the interpret-marked tests skip without it
    triton = None
else:
    @triton.jit
    def stream_runs_kernel(position_ptr, out_ptr, total, programs, N: tl.constexpr):
        """Stores the stream schedule's run of each position (``kernels._stream_run_of``)."""
        offs = tl.arange(0, N)
        position = tl.load(position_ptr + offs)
        tl.store(out_ptr + offs, triton_kernels._stream_run_of(position, total, programs, total >= programs))


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


def request_items(segments, b):
    first, full, tail = segments[b].tolist()
    return list(range(first, first + full)) + ([tail] if tail >= 0 else [])


@settings(max_examples=300, deadline=None)
@given(steps())
def test_every_page_once_no_segment_across_requests_balanced(step):
    row_lens, qlen, page, max_pages, num_items = step
    work, segments = pure.build_schedule(row_lens, qlen, page, max_pages, num_items)
    batch = row_lens.shape[0] // qlen
    assert work.shape == (num_items, 3) and segments.shape == (batch, 3)
    assert work.dtype == segments.dtype == torch.int32
    pages = [min(cdiv(int(row_lens[b * qlen + qlen - 1]), page), max_pages) for b in range(batch)]
    chunk = best_chunk(pages, num_items) if batch else 1
    owner = [None] * num_items
    for b in range(batch):
        items = request_items(segments, b)
        assert 1 <= len(items) <= num_items
        covered = []
        for item in items:
            request, lo, hi = work[item].tolist()
            assert request == b and owner[item] is None, "an item belongs to one request's one segment"
            owner[item] = b
            assert hi - lo <= chunk, "no item above the balanced share"
            covered += range(lo, hi)
        assert covered == list(range(pages[b])), "every page of the request once, in order"
    for item, who in enumerate(owner):
        if who is None:
            assert work[item].tolist() == [0, 0, 0], "unused items are empty"
    used = [item for item, who in enumerate(owner) if who is not None]
    assert used == list(range(len(used))), "the used items come first"
    spans = [int(work[i, 2] - work[i, 1]) for i in used]
    assert spans == sorted(spans, reverse=True), "longest first (the GPU hands programs out in launch order)"
    if batch:
        # The share is the least that fits: one page less would need more items than there are.
        assert chunk == 1 or sum(max(1, cdiv(n, chunk - 1)) for n in pages) > num_items


def test_one_long_request_among_short_ones_is_spread():
    """R4's shape: 131072 tokens beside seven of 2000 (64-token pages); the
    long one gets most items, the short ones one each, and the long one's
    full items run first."""
    lens = [131072] + [2000] * 7
    rows = torch.tensor([n - 4 + 1 + t for n in lens for t in range(4)], dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 4, 64, 2048, 8 * 8)
    counts = [len(request_items(segments, b)) for b in range(8)]
    assert counts[1:] == [1] * 7 and counts[0] == 57
    spans = (work[:, 2] - work[:, 1]).tolist()
    assert max(spans) == 36 and sum(spans) == 2048 + 7 * 32
    assert segments[0].tolist() == [0, 56, 56] and work[:56, 0].tolist() == [0] * 56
    assert work[56].tolist() == [0, 2016, 2048] and work[57:, 0].tolist() == list(range(1, 8))


def test_uniform_lengths_split_evenly():
    rows = torch.tensor([8192] * 12, dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 3, 64, 128, 4 * 4)
    assert segments.tolist() == [[4 * b, 4, -1] for b in range(4)] and set((work[:, 2] - work[:, 1]).tolist()) == {32}


def test_tails_longest_first_ties_in_request_order():
    # Pages 10, 3, 7, 0, 3 with 8 items: chunk 4 -> full items 2 + 0 + 1 + 0 + 0,
    # tails of 2, 3, 3, 0 (empty request), 3 pages.
    pages = [10, 3, 7, 0, 3]
    rows = torch.tensor([64 * n for n in pages], dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 1, 64, 16, 8)
    assert work.tolist() == [[0, 0, 4], [0, 4, 8], [2, 0, 4], [1, 0, 3], [2, 4, 7], [4, 0, 3], [0, 8, 10],
                             [3, 0, 0]]
    assert segments.tolist() == [[0, 2, 6], [2, 0, 3], [2, 1, 4], [3, 0, 7], [3, 0, 5]]


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
    assert segments[1, 2] >= 0 or segments[1, 1] > 1
    if segments[1, 2] >= 0:
        segments[1, 2] = -1
    else:
        segments[1, 1] -= 1
    cut = mla_dcp.verify(shard.cfg, view._replace(segments=segments), problem.q, shard.kv_cache)
    assert torch.equal(cut[0][:2], out[:2]) and not torch.allclose(cut[1][2:], lse[2:])


@pytest.mark.interpret
@settings(max_examples=40, deadline=None)
@given(steps())
def test_the_schedule_kernel_equals_the_oracle(step):
    from mla_dcp.ops import launchers

    row_lens, qlen, page, max_pages, num_items = step
    got = launchers.schedule(row_lens, qlen, page, max_pages, num_items)
    want = pure.build_schedule(row_lens, qlen, page, max_pages, num_items)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.interpret
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3), st.integers(1, 3), st.booleans(),
       st.sampled_from([1, 16, 64]), st.integers(1, 60), st.lists(st.integers(0, 5000), max_size=9),
       st.integers(1, 6), st.booleans())
def test_the_fused_metadata_kernel_equals_row_lens_then_schedule(qlen, world, rank, interleave, causal, page,
                                                                  max_pages, lens, per_request, context):
    """One launch for stage 1 and the schedule: the schedule's lengths are
    computed in the kernel from seq_lens, not read back from row_lens; a
    masked block's context (``context``) from ``max(L - qlen, 0)``, in the kernel too."""
    from mla_dcp.ops import launchers

    rank = rank % world
    seq_lens = torch.tensor(lens + [qlen - 1] * context, dtype=torch.int32)    # a context shorter than 0
    num_items = max(1, seq_lens.shape[0] * per_request)
    got = launchers.step_metadata(seq_lens, qlen, world, rank, interleave, causal, page, max_pages, num_items,
                                  context=context)
    seen = (seq_lens - qlen).clamp_min(0) if context else seq_lens
    rows = pure.verify_row_lens(seen, qlen, world, rank, interleave, causal=causal)
    want = (rows, *pure.build_schedule(rows, qlen, page, max_pages, num_items))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@settings(max_examples=120, deadline=None)
@given(steps(), st.integers(1, 40), st.integers(0, 5))
def test_a_fixed_chunk_cuts_every_request_at_the_same_pages(step, chunk, extra):
    """Batch-invariant mode's schedule: segments of exactly ``chunk`` pages
    from page 0 whatever the other lengths; the same properties otherwise."""
    row_lens, qlen, page, max_pages, _ = step
    batch = row_lens.shape[0] // qlen
    num_items = batch * cdiv(max_pages, chunk) + extra
    work, segments = pure.build_schedule(row_lens, qlen, page, max_pages, num_items, chunk)
    for b in range(batch):
        n = min(cdiv(int(row_lens[b * qlen + qlen - 1]), page), max_pages)
        spans = [tuple(work[i, 1:].tolist()) for i in request_items(segments, b)]
        want = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)] or [(0, 0)]
        assert spans == want
    if batch and max_pages > chunk:
        with pytest.raises(ValueError, match="num_items must be >= B"):
            pure.build_schedule(row_lens, qlen, page, max_pages, batch * cdiv(max_pages, chunk) - 1, chunk)


@pytest.mark.interpret
@settings(max_examples=30, deadline=None)
@given(steps(), st.integers(1, 40))
def test_the_kernel_takes_the_fixed_chunk_as_the_oracle_does(step, chunk):
    from mla_dcp.ops import launchers

    row_lens, qlen, page, max_pages, _ = step
    num_items = max(1, row_lens.shape[0] // qlen * cdiv(max_pages, chunk))
    got = launchers.schedule(row_lens, qlen, page, max_pages, num_items, chunk)
    want = pure.build_schedule(row_lens, qlen, page, max_pages, num_items, chunk)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def stream_of(step, programs):
    row_lens, qlen, page, max_pages, _ = step
    batch = row_lens.shape[0] // qlen
    return pure.build_schedule(row_lens, qlen, page, max_pages, programs + batch, programs=programs)


@settings(max_examples=300, deadline=None)
@given(steps(), st.integers(1, 40))
def test_the_stream_gives_every_program_its_share_of_the_pages(step, programs):
    """The stream schedule (programs > 0): each request's pieces cover its
    pages once, in order, in consecutive slots; the programs' runs take the
    pieces in order, each at most cdiv(total, programs) pages; every request
    has a piece, an empty one exactly one empty piece."""
    row_lens, qlen, page, max_pages, _ = step
    batch = row_lens.shape[0] // qlen
    num_items = programs + batch
    work, segments = stream_of(step, programs)
    assert work.shape == (num_items, 5) and segments.shape == (batch, 3) and work.dtype == torch.int32
    pages = [min(cdiv(int(row_lens[b * qlen + qlen - 1]), page), max_pages) for b in range(batch)]
    share = max(1, cdiv(sum(pages), programs))
    owner = [None] * num_items
    for b in range(batch):
        first, count, tail = segments[b].tolist()
        assert tail == -1 and 1 <= count <= programs, "at most the static count of pieces per request"
        covered = []
        for piece in range(first, first + count):
            request, lo, hi = work[piece, :3].tolist()
            assert request == b and owner[piece] is None
            owner[piece] = b
            covered += range(lo, hi)
            assert hi > lo or pages[b] == 0, "no empty piece of a request with pages"
        assert covered == list(range(pages[b])), "every page of the request once, in order"
        assert count == 1 or pages[b] > 0
    pieces = sum(who is not None for who in owner)
    assert all(who is not None for who in owner[:pieces]), "the pieces come first"
    assert all(work[i, :3].tolist() == [0, 0, 0] for i in range(pieces, num_items)), "unused rows are empty"
    runs = [work[p, 3:].tolist() for p in range(num_items)]
    taken = [piece for first, end in runs for piece in range(first, end)]
    # (With no request nothing is launched.)
    assert taken == list(range(pieces)) or not batch, "the runs take every piece once, in order, and nothing else"
    work_of = [sum(int(work[i, 2] - work[i, 1]) for i in range(first, end)) for first, end in runs]
    assert max(work_of) <= share and not any(work_of[programs:]), "at most `programs` programs have pages"


def test_the_stream_makes_a_ragged_step_as_even_as_a_uniform_one():
    """R3's lengths (64 requests, 16000 tokens at most): one-piece programs
    leave the longest at 1.4x the mean program; the stream's runs are equal
    to a page."""
    from mla_dcp import bench
    lens = bench.RAGGED["R3"][2]
    rows = torch.tensor([n - 1 + t for n in lens for t in range(2)], dtype=torch.int32)
    pages = [cdiv(n, 64) for n in lens]
    mean = sum(pages) / 128
    work, _ = pure.build_schedule(rows, 2, 64, 250, 128)
    assert int((work[:, 2] - work[:, 1]).max()) > 1.35 * mean
    work, _ = pure.build_schedule(rows, 2, 64, 250, 128 + 64, programs=128)
    per_run = [int((work[f:e, 2] - work[f:e, 1]).sum()) for f, e in work[:, 3:].tolist()]
    assert max(per_run) == cdiv(sum(pages), 128) and sum(per_run) == sum(pages)
    # Its uniform twin (137 or 136 pages a request): the cuts fall on the requests' boundaries, two
    # pieces a request as the one-piece schedule has, not a third where runs of 69 pages drift.
    twin = bench.lengths_of("R3u")
    rows = torch.tensor([n - 1 + t for n in twin for t in range(2)], dtype=torch.int32)
    _, segments = pure.build_schedule(rows, 2, 64, 250, 128 + 64, programs=128)
    assert segments[:, 1].tolist() == [2] * 64


def test_the_stream_places_empty_requests_at_their_position():
    # Pages 0, 5, 0, 0, 3, 0 over 2 programs (4 pages each): the leading
    # empty request opens run 0, the two between start run 1, the last
    # goes with the stream's end.
    rows = torch.tensor([64 * n for n in [0, 5, 0, 0, 3, 0]], dtype=torch.int32)
    work, segments = pure.build_schedule(rows, 1, 64, 8, 8, programs=2)
    assert work[:, :3].tolist() == [[0, 0, 0], [1, 0, 4], [1, 4, 5], [2, 0, 0], [3, 0, 0], [4, 0, 3], [5, 0, 0],
                                    [0, 0, 0]]
    assert work[:, 3:].tolist() == [[0, 2], [2, 7], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0]]
    assert segments.tolist() == [[0, 1, -1], [1, 2, -1], [3, 1, -1], [4, 1, -1], [5, 1, -1], [6, 1, -1]]


def test_the_stream_refuses_too_few_rows():
    rows = torch.tensor([64, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="programs \\+ B = 6"):
        pure.build_schedule(rows, 1, 64, 8, 5, programs=4)
    with pytest.raises(ValueError, match="chunk and programs"):
        pure.build_schedule(rows, 1, 64, 8, 6, chunk=2, programs=4)


@pytest.mark.interpret
@settings(max_examples=40, deadline=None)
@given(steps(), st.integers(1, 40))
def test_the_kernel_builds_the_stream_as_the_oracle_does(step, programs):
    from mla_dcp.ops import launchers

    row_lens, qlen, page, max_pages, _ = step
    num_items = programs + row_lens.shape[0] // qlen
    got = launchers.schedule(row_lens, qlen, page, max_pages, num_items, 0, programs)
    want = stream_of(step, programs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.interpret
@pytest.mark.parametrize("pages, programs", [
    ([64], 128),                 # one request over every program (C7): a step of 128 pieces
    ([5000], 300),               # more pieces than one step holds
    ([3], 128),                  # fewer pages than programs: nearly every row past the runs
    ([0, 700, 1], 257), ([40, 0, 9000, 2, 0], 200),
    ([1] * 33, 46340),           # the most programs the 32-bit cuts allow
    ([2 * 46340 - 1], 46340),    # and their largest product, (P - 1) * (total % P)
])
def test_the_kernel_builds_a_few_long_requests_stream_as_the_oracle_does(pages, programs):
    """A few requests over many programs: the stream's tiles take a row per
    request, not 32 rows, and its cuts are 32-bit (run * (total // P) +
    run * (total % P) // P); both must still give the oracle's schedule."""
    from mla_dcp.ops import launchers

    rows = torch.tensor([64 * n for n in pages], dtype=torch.int32)
    num_items = programs + len(pages)
    got = launchers.schedule(rows, 1, 64, 100000, num_items, 0, programs)
    want = pure.build_schedule(rows, 1, 64, 100000, num_items, programs=programs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_stream_refuses_more_programs_than_its_cuts_hold():
    from mla_dcp.ops import launchers

    with pytest.raises(ValueError, match="up to 46340 programs, got 46341"):
        launchers.schedule(torch.tensor([64], dtype=torch.int32), 1, 64, 8, 46342, 0, 46341)


@pytest.mark.interpret
@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3), st.booleans(), st.sampled_from([1, 16, 64]),
       st.integers(1, 60), st.lists(st.integers(0, 5000), max_size=9), st.integers(1, 20), st.booleans())
def test_the_fused_metadata_kernel_builds_the_stream(qlen, world, rank, causal, page, max_pages, lens, programs,
                                                     context):
    from mla_dcp.ops import launchers

    rank = rank % world
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = launchers.step_metadata(seq_lens, qlen, world, rank, 2, causal, page, max_pages, programs + len(lens), 0,
                                  programs, context)
    seen = (seq_lens - qlen).clamp_min(0) if context else seq_lens
    rows = pure.verify_row_lens(seen, qlen, world, rank, 2, causal=causal)
    want = (rows, *pure.build_schedule(rows, qlen, page, max_pages, programs + len(lens), programs=programs))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def assert_kernel_schedules_pages_as_the_oracle(pages, num_items):
    """The schedule kernel's work and segments for requests of ``pages`` pages (16-token pages, q 1)
    equal the oracle's."""
    from mla_dcp.ops import launchers

    rows = torch.tensor([16 * n for n in pages], dtype=torch.int32)
    got = launchers.schedule(rows, 1, 16, 1000, num_items)
    want = pure.build_schedule(rows, 1, 16, 1000, num_items)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.interpret
@pytest.mark.parametrize("pages, num_items", [
    ([0, 0, 0], 3),              # no page: every chunk fits, the least is 1
    ([0, 0, 0], 4),
    ([50, 3, 0, 7], 5),          # one item to spare: the upper bound is the total itself
    ([50, 3, 0, 7], 4),          # none to spare: the longest request's pages
    ([64], 100),                 # more items than pages: both bounds 1, no step
    ([9, 9, 9, 9], 8),           # uniform, two items a request
    ([1000, 1, 1, 1], 7),
])
def test_the_kernels_bisection_bounds_hold_at_their_edges(pages, num_items):
    # The kernel bisects between total / num_items and total / (num_items - B)
    # pages a chunk; the oracle over [1, max_pages]: the same least chunk.
    assert_kernel_schedules_pages_as_the_oracle(pages, num_items)


@pytest.mark.interpret
@pytest.mark.parametrize("pages, num_items", [
    ([64] * 32, 96),                       # uniform, every request a tail of the same length: request order
    ([64] * 40, 120),                      # the same past 32 requests (no sort either)
    ([5, 9, 5, 0, 9, 2, 5], 14),           # ragged tails with ties: the sort
    ([700, 27, 28, 73], 132),              # R1's pages: one tail longer than the others
    ([1 + (7 * b) % 23 for b in range(40)] + [0, 0], 60),   # ragged, 42 requests (a wider sort)
    ([128] * 128, 128),                    # C6: one segment a request, no tail at all
    ([3, 0, 0, 0], 4),                     # a tail and empty requests' segments of length 0
])
def test_the_kernel_orders_tails_as_the_oracle_by_every_route(pages, num_items):
    # Tails of one length keep request order without a sort, others are
    # sorted: one ordering, the oracle's, either way.
    assert_kernel_schedules_pages_as_the_oracle(pages, num_items)


@pytest.mark.interpret
@pytest.mark.parametrize("total, programs", [(1, 1), (7, 3), (131072, 128), (10 ** 7, 46340), ((1 << 31) - 1, 46340),
                                             (46339, 46340)])
def test_the_streams_run_of_each_page_is_exact_without_64_bit_division(total, programs):
    # The kernel's run of a page: a float32 quotient moved onto the exact one;
    # checked at every cut's edges, where an estimate off by one shows.
    wide = total >= programs
    cuts = [r * total // programs if wide else min(r, total) for r in range(programs + 1)]
    picks = sorted({max(0, min(total, p + d)) for p in cuts[:: max(1, programs // 50)] + cuts[-3:] for d in (-1, 0, 1)})
    n = triton.next_power_of_2(len(picks))
    position = torch.tensor(picks + [total] * (n - len(picks)), dtype=torch.int32)
    out = torch.empty_like(position)
    stream_runs_kernel[(1,)](position, out, total, programs, N=n)
    want = [((p + 1) * programs - 1) // max(total, 1) if wide else p for p in position.tolist()]
    assert out.tolist() == want


@pytest.mark.interpret
@pytest.mark.parametrize("batch", [300, 1100])
def test_large_batches_take_smaller_steps_and_more_warps_with_the_same_schedules(batch):
    # Past 256 requests the launcher writes a request's pieces one at a time
    # over several warps (its builds' registers); the schedules are unchanged.
    from mla_dcp.ops import launchers

    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 9000, (batch,), generator=gen, dtype=torch.int32)
    lens[::7] = 0
    seq_lens = lens * 2
    rows = pure.verify_row_lens(seq_lens, 2, 2, 1, 1, causal=True)
    consts = launchers._schedule_constants(batch, 160, 2 * batch)
    # Four warps up to 1024 requests (BLOCK_B), a warp per 128 past that.
    assert consts["ITEMS_STEP"] <= 2 and consts["num_warps"] == (4 if batch <= 1024 else 16)
    for num_items, programs in ((2 * batch, 0), (3 * batch, 2 * batch)):
        got = launchers.step_metadata(seq_lens, 2, 2, 1, 1, True, 64, 160, num_items, 0, programs)
        want = (rows, *pure.build_schedule(rows, 2, 64, 160, num_items, programs=programs))
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_which_steps_take_the_stream(monkeypatch):
    """schedule_shape on an H200-like device (no GPU needed: static facts
    only): the narrow kernel's shapes take the stream when it is switched on
    for GPUs, the seesaw's never (one piece per program; its fp8-products
    build too); the CPU always;
    batch-invariant mode, a fixed segment count and VerifyConfig(stream=False)
    never."""
    from mla_dcp.ops import tiles

    monkeypatch.setitem(tiles._DEVICE_FACTS, 0, ("NVIDIA H200", 132))
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")

    def shape(device, heads, qlen, batch=64, kv=torch.bfloat16, **extra):
        cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=64, max_model_len=8 * 16000,
                                   dcp_world_size=8, kv_lora_rank=512, rope_dim=64, softmax_scale=0.1, **extra)
        return mla_dcp.schedule_shape(cfg, batch, device, torch.bfloat16, kv)

    narrow, seesaw = dict(heads=16, qlen=2), dict(heads=128, qlen=3)
    monkeypatch.setattr(tiles, "STREAM_ON_GPU", False)
    items, programs = shape(gpu, **narrow)
    assert programs == 0 and items % 64 == 0
    monkeypatch.setattr(tiles, "STREAM_ON_GPU", True)
    assert shape(gpu, **narrow) == (items + 64, items)
    assert shape(gpu, **seesaw, batch=32)[1] == 0
    fp8 = torch.float8_e4m3fn
    assert shape(gpu, **seesaw, batch=32, kv=fp8, fp8_products=True)[1] == 0
    items, programs = shape(cpu, **narrow)
    assert programs > 0 and items == programs + 64
    assert shape(cpu, **narrow, batch_invariant=True)[1] == 0
    assert shape(cpu, **narrow, num_segments=3) == (3 * 64, 0)
    # VerifyConfig.stream: False keeps one piece per program everywhere; True takes the stream
    # where the default would, whatever MLA_DCP_STREAM says (never the seesaw's one-piece programs).
    assert shape(cpu, **narrow, stream=False) == (items - 64, 0)
    assert shape(gpu, **narrow, stream=False)[1] == 0
    monkeypatch.setattr(tiles, "STREAM_ON_GPU", False)
    assert shape(gpu, **narrow)[1] == 0
    assert shape(gpu, **narrow, stream=True)[1] > 0
    assert shape(gpu, **seesaw, batch=32, stream=True)[1] == 0


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False)])
def test_the_stream_is_the_gpus_default_unless_switched_off(value, on):
    # Read once at import (a compiled graph must not guard on it): a fresh interpreter per value.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MLA_DCP_STREAM"}
    if value is not None:
        env["MLA_DCP_STREAM"] = value
    out = subprocess.run([sys.executable, "-c", "from mla_dcp.ops import tiles; print(tiles.STREAM_ON_GPU)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(on)
