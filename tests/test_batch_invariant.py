"""Batch invariance (DESIGN.md stage 3, "Segments"): with
VerifyConfig(batch_invariant=True) a row's output and LSE bits depend only on
its own query, its own window and the static configuration."""

import dataclasses
import sys

import pytest
import torch

import mla_dcp

DL, DR, BLOCK, MAX_LEN = 32, 16, 16, 12288
HEADS = 4


def config(qlen, invariant=True, world=1, rank=0, interleave=1, heads=HEADS, dl=DL, dr=DR, block=BLOCK,
           segment_tokens=4096):
    return mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=MAX_LEN,
                                dcp_world_size=world, dcp_rank=rank, interleave=interleave, kv_lora_rank=dl,
                                rope_dim=dr, softmax_scale=0.3 if dl == DL else 192 ** -0.5,
                                batch_invariant=invariant, invariant_segment_tokens=segment_tokens)


class World:
    """One cache holding several requests' keys (each its own blocks) and
    one query per (request, global position): any step over any subset of
    requests, any q, reads the same numbers."""

    def __init__(self, lengths, device="cpu", dtype=torch.float32, seed=0, heads=HEADS, dl=DL, dr=DR,
                 block=BLOCK, kv_dtype=None):
        g = torch.Generator().manual_seed(seed)
        self.lengths = lengths
        self.device, self.dtype = device, dtype
        self.heads, self.width = heads, dl + dr
        self.blocks = []
        total = 0
        for n in lengths:
            count = -(-n // block)
            self.blocks.append(list(range(total, total + count)))
            total += count
        kv = torch.randn(total + 1, block, dl + dr, generator=g)
        kv[-1] = float("nan")                # a block no request owns: never read
        self.kv_scale = None
        if kv_dtype is not None and kv_dtype.itemsize == 1:
            self.kv_scale = torch.full((1,), 1 / 32, device=device)
            self.kv = (kv * 32).to(device).to(kv_dtype)
        else:
            self.kv = kv.to(device, dtype)
        self.q = [torch.randn(n, heads, dl + dr, generator=g).to(device, dtype) for n in lengths]

    def inputs(self, cfg, requests, ends):
        """verify's inputs over ``requests`` (indices; None = a padding request), the
        verify rows ending at global position ``ends[i]``."""
        table = torch.full((len(requests), cfg.min_table_blocks), self.kv.shape[0] - 1, dtype=torch.int32)
        rows = []
        for i, r in enumerate(requests):
            if r is not None:
                # A rank's table: the request's first blocks hold this rank's tokens here.
                ids = self.blocks[r][:cfg.min_table_blocks]
                table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
                rows.append(self.q[r][ends[i] - cfg.qlen:ends[i]])
            else:
                rows.append(torch.zeros(cfg.qlen, self.heads, self.width, dtype=self.dtype, device=self.device))
        seq = torch.tensor([e if r is not None else 0 for r, e in zip(requests, ends)], dtype=torch.int32)
        seq, table = seq.to(self.device), table.to(self.device)
        return cfg, seq, table, torch.cat(rows)

    def step(self, cfg, requests, ends, how="eager"):
        cfg, seq, table, q = self.inputs(cfg, requests, ends)

        def run(seq, table, q):
            view = mla_dcp.build_view(cfg, seq, table, q_dtype=self.dtype, kv_dtype=self.kv.dtype)
            return mla_dcp.verify(cfg, view, q, self.kv, self.kv_scale)

        if how == "eager":
            return run(seq, table, q)
        if how == "compiled":
            return torch.compile(run, fullgraph=True)(seq, table, q)
        run(seq, table, q)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = run(seq, table, q)
        graph.replay()
        return result


LENGTHS = [9000, 300, 5000, 4097, 12000]


def row_of(result, i, t, qlen):
    out, lse = result
    return out[i * qlen + t], lse[i * qlen + t]


def same_bits(a, b):
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.fixture(autouse=True, scope="module")
def many_threads():
    # CPU kernels split their work by the threads they have: a 2-core machine
    # would hide a row whose bits depend on the batch only at 16 (the GPU hosts').
    before = torch.get_num_threads()
    torch.set_num_threads(16)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world():
    return World(LENGTHS)


def test_a_request_alone_equals_it_in_any_batch(world):
    cfg = config(3)
    alone = world.step(cfg, [0], [9000])
    for requests in ([0, 1, 2], [2, 4, 0, None], [None, 3, 1, 0, 4]):
        ends = [LENGTHS[r] if r is not None else 0 for r in requests]
        batch = world.step(cfg, requests, ends)
        i = requests.index(0)
        for t in range(3):
            assert same_bits(row_of(batch, i, t, 3), row_of(alone, 0, t, 3)), (requests, t)


def test_fp8_products_are_batch_invariant_too():
    # The mode's roundings (P per 64-token tile of a segment) follow the
    # invariant segments, so both properties hold together.
    world = World(LENGTHS[:3], dtype=torch.float16, kv_dtype=torch.float8_e4m3fn)
    cfg = dataclasses.replace(config(3), fp8_products=True)
    alone = world.step(cfg, [0], [9000])
    batch = world.step(cfg, [1, 0, 2], [300, 9000, 5000])
    exact = world.step(config(3), [0], [9000])
    for t in range(3):
        assert same_bits(row_of(batch, 1, t, 3), row_of(alone, 0, t, 3)), t
    assert not torch.equal(alone[0], exact[0])


def test_a_verify_row_equals_the_decode_step_at_its_position_and_other_qs(world):
    rows = {}
    for qlen in (1, 2, 4):
        cfg = config(qlen)
        result = world.step(cfg, [2, 0], [5000, 9000])
        for t in range(qlen):
            rows.setdefault(9000 - (qlen - 1 - t), []).append(row_of(result, 1, t, qlen))
    compared = 0
    for position, found in rows.items():
        for other in found[1:]:
            assert same_bits(other, found[0]), position
            compared += 1
    assert compared >= 3      # position 9000 in all three, 8999 in q = 2 and 4


@pytest.mark.parametrize("world_size,rank,interleave", [(2, 1, 1), (3, 0, 4)])
def test_invariant_on_every_dcp_rank(world, world_size, rank, interleave):
    cfg = config(2, world=world_size, rank=rank, interleave=interleave)
    # Each rank reads only its own share of every window (its local lengths); the test's cache
    # stands in for the rank's own: what is checked is that the rows' arithmetic ignores the batch.
    alone = world.step(cfg, [4], [12000])
    batch = world.step(cfg, [1, 4, 3], [300, 12000, 4097])
    for t in range(2):
        assert same_bits(row_of(batch, 1, t, 2), row_of(alone, 0, t, 2))


def test_merge_ranks_is_run_to_run_deterministic(world):
    outs = torch.randn(3, 8, HEADS, DL)
    lses = torch.randn(3, 8, HEADS)
    first = mla_dcp.merge_ranks(outs, lses)
    assert same_bits(first, mla_dcp.merge_ranks(outs.clone(), lses.clone()))


def test_the_default_mode_is_not_invariant(world):
    """Negative control: the balanced schedule cuts a request where the step's
    other lengths put the chunk, so the same row comes out with other bits
    (a test of invariance can fail)."""
    cfg = config(3, invariant=False)
    alone = world.step(cfg, [0], [9000])
    batch = world.step(cfg, [0, 1, 2, 3, 4], LENGTHS)
    differs = any(not same_bits(row_of(batch, 0, t, 3), row_of(alone, 0, t, 3)) for t in range(3))
    assert differs
    # ... and both are right to rounding.
    for t in range(3):
        torch.testing.assert_close(row_of(batch, 0, t, 3)[0], row_of(alone, 0, t, 3)[0], rtol=1e-4, atol=1e-5)


def test_invariant_results_equal_the_default_to_rounding(world):
    got = world.step(config(3), [0, 2], [9000, 5000])
    want = world.step(config(3, invariant=False), [0, 2], [9000, 5000])
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_the_schedule_cuts_at_fixed_pages():
    cfg = config(2)
    assert cfg.invariant_chunk_pages == 4096 // cfg.page_size and cfg.schedule_chunk == cfg.invariant_chunk_pages
    assert config(2, invariant=False).schedule_chunk == 0
    view = mla_dcp.build_view(cfg, torch.tensor([9000, 17, 0], dtype=torch.int32),
                              torch.zeros(3, cfg.min_table_blocks, dtype=torch.int32))
    spans = [(int(lo), int(hi)) for r, lo, hi in view.work.tolist() if r == 0 and hi > lo]
    chunk = cfg.invariant_chunk_pages
    assert sorted(spans) == [(0, chunk), (chunk, 2 * chunk), (2 * chunk, -(-9000 // cfg.page_size))]
    assert view.work.shape[0] == 3 * -(-cfg.max_pages // chunk)


@pytest.mark.parametrize("tokens", [512, 2048, None])
def test_other_segment_lengths_are_invariant_and_cut_there(world, tokens):
    cfg = config(2, segment_tokens=tokens)
    # None: the length by heads, 1024 tokens at these 4 heads.
    assert cfg.invariant_chunk_pages == (tokens or 1024) // cfg.page_size
    view = mla_dcp.build_view(cfg, torch.tensor([5000], dtype=torch.int32),
                              torch.zeros(1, cfg.min_table_blocks, dtype=torch.int32))
    starts = sorted(int(lo) for r, lo, hi in view.work.tolist() if hi > lo)
    assert starts == list(range(0, -(-5000 // cfg.page_size), cfg.invariant_chunk_pages))
    alone = world.step(cfg, [0], [9000])
    batch = world.step(cfg, [3, 0, None, 1], [LENGTHS[3], 9000, 0, LENGTHS[1]])
    for t in range(2):
        assert same_bits(row_of(batch, 1, t, 2), row_of(alone, 0, t, 2)), t
    # Another segment length is another static configuration: right to rounding, not to the bit.
    other = world.step(config(2), [0], [9000])
    torch.testing.assert_close(alone[0], other[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heads, tokens", [(1, 1024), (4, 1024), (16, 1024), (17, 2048), (32, 2048), (33, 4096),
                                           (64, 4096), (128, 4096), (256, 4096)])
def test_the_default_segment_length_is_64_tokens_a_head_in_1024_to_4096(heads, tokens):
    cfg = config(2, heads=heads, segment_tokens=None)
    assert cfg.invariant_segment_tokens is None and cfg.invariant_tokens == tokens
    assert cfg.invariant_chunk_pages == tokens // cfg.page_size == cfg.schedule_chunk
    # The rule follows the config it is asked of (None stays None), and a length given wins.
    assert dataclasses.replace(cfg, num_heads=128).invariant_tokens == 4096
    assert dataclasses.replace(cfg, num_heads=8).invariant_tokens == 1024
    assert config(2, heads=heads, segment_tokens=256).invariant_tokens == 256
    # The length is the heads' alone: another qlen (a decode step) cuts at the same tokens.
    assert config(1, heads=heads, segment_tokens=None).invariant_chunk_pages == cfg.invariant_chunk_pages


@pytest.mark.parametrize("tokens", [64, 3000, True, 1 << 21])
def test_the_segment_length_is_a_power_of_two_of_at_least_128_tokens(tokens):
    with pytest.raises(ValueError, match="invariant_segment_tokens must be None or a power of two"):
        config(2, segment_tokens=tokens)


def test_num_segments_cannot_be_set_with_batch_invariant():
    with pytest.raises(ValueError, match="num_segments must be None with batch_invariant"):
        dataclasses.replace(config(2), num_segments=3)
    with pytest.raises(ValueError, match="batch_invariant must be a bool"):
        dataclasses.replace(config(2), batch_invariant=1)


@pytest.mark.interpret
def test_the_triton_kernels_are_invariant_under_the_interpreter(monkeypatch):
    """The Triton launchers (interpreted on CPU tensors) with fp16 queries:
    the same request alone and in a batch, and its rows against q = 1."""
    from mla_dcp.ops import launchers, library

    monkeypatch.setattr(library, "plain_eager_cuda", lambda tensor: True)   # route to the launchers
    launched = []
    # verify's merged_attention launcher calls these by their module names.
    monkeypatch.setitem(library._LAUNCHERS, "merged_attention", launchers.merged_attention)
    for name in ("segmented_attention", "single_segment_attention", "merge_segments"):
        real = getattr(launchers, name)
        monkeypatch.setattr(launchers, name, lambda *args, real=real, name=name: launched.append(name) or real(*args))
    monkeypatch.setattr(sys.modules[__name__], "MAX_LEN", 9216)     # three fixed segments a request
    small = World([700, 90, 1300, 8300], dtype=torch.float16, seed=3)
    cfg = config(2)
    alone = small.step(cfg, [3], [8300])
    batch = small.step(cfg, [2, 3, 1, 0], [1300, 8300, 90, 700])
    assert "segmented_attention" in launched and "merge_segments" in launched
    for t in range(2):
        assert same_bits(row_of(batch, 1, t, 2), row_of(alone, 0, t, 2))
    decode = small.step(config(1), [1, 3], [90, 8300])
    assert same_bits(row_of(decode, 1, 0, 1), row_of(alone, 0, 1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [16, 64])
def test_invariant_on_the_gpu_eager_graphed_and_compiled(kv, heads):
    """On the GPU's kernels (the seesaw on Hopper, the Triton kernels
    elsewhere; bf16 and e4m3 caches): a request alone, in a batch, as q = 1
    decode rows, eager, replayed from a CUDA graph and compiled, all bit
    for bit; and the default mode's negative control."""
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    big = World([9000, 300, 5000, 4097], device="cuda", dtype=torch.bfloat16, heads=heads, dl=512, dr=64,
                block=64, kv_dtype=kv_dtype, seed=5)
    wide = dict(heads=heads, dl=512, dr=64, block=64)
    alone = big.step(config(3, **wide), [0], [9000])
    for how in ("eager", "graph", "compiled"):
        batch = big.step(config(3, **wide), [2, 0, None, 3, 1], [5000, 9000, 0, 4097, 300], how=how)
        for t in range(3):
            assert same_bits(row_of(batch, 1, t, 3), row_of(alone, 0, t, 3)), (how, t)
    for qlen in (1, 2):
        other = big.step(config(qlen, **wide), [1, 0], [300, 9000])
        assert same_bits(row_of(other, 1, qlen - 1, qlen), row_of(alone, 0, 2, 3)), qlen
    default = config(3, invariant=False, **wide)
    assert not all(same_bits(row_of(big.step(default, [0, 1, 2, 3], [9000, 300, 5000, 4097]), 0, t, 3),
                             row_of(big.step(default, [0], [9000]), 0, t, 3)) for t in range(3))


def test_compiled_equals_eager_bit_for_bit(world):
    torch._dynamo.reset()
    cfg = config(2)
    eager = world.step(cfg, [2, 0], [5000, 9000])
    compiled = world.step(cfg, [2, 0], [5000, 9000], how="compiled")
    assert same_bits(compiled, eager)


def test_a_rows_bits_do_not_follow_the_longer_rows_computed_beside_it():
    # The CPU path computes a block of items over the pages its rows see (not the static segment):
    # request 0 (128 keys, its value column 3 all -0.0) alone spans 2 pages, beside request 1
    # (256 keys) 4. Every bit of its partial stays, the sign of a sum that is exactly zero included.
    from mla_dcp import pure
    g = torch.Generator().manual_seed(3)
    page, width = 64, DL + DR
    kv = torch.randn(8, page, width, generator=g)
    kv[:2, :, 3] = -0.0
    q = torch.randn(2, HEADS, width, generator=g)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    common = dict(qlen=1, kv_lora_rank=DL, softmax_scale=0.3, span=4)
    beside = pure.segmented_attention(q, kv, torch.tensor([128, 256], dtype=torch.int32), table,
                                      torch.tensor([[0, 0, 4], [1, 0, 4]], dtype=torch.int32), **common)
    alone = pure.segmented_attention(q[:1], kv, torch.tensor([128], dtype=torch.int32), table[:1],
                                     torch.tensor([[0, 0, 4]], dtype=torch.int32), **common)
    assert (alone[0][0, :, :, 3] == 0).all() and (alone[2][0] > 0).all()
    for got, want in zip(beside, alone):
        assert torch.equal(got[:1].view(torch.int32), want.view(torch.int32))


@pytest.mark.interpret
def test_the_merge_takes_one_tile_whatever_the_rows_and_a_long_requests_items_16_at_a_time():
    """Batch-invariant mode's segment merge: the same tile (whole rows, at most 16 items a step)
    for a step of few rows and of many, where the default mode splits a few-row step's columns (the
    negative control); 16 items a step for a request of 45 (a [64, 512] float32 tile spills)."""
    from mla_dcp.ops import fast_launch, launchers

    def tiles_of(batch, items_each, invariant, heads=16, qlen=2, width=512):
        items = batch * items_each
        partials = (torch.randn(items, heads, qlen, width), torch.randn(items, heads, qlen),
                    torch.rand(items, heads, qlen) + 1)
        segments = torch.tensor([[b * items_each, items_each, -1] for b in range(batch)], dtype=torch.int32)
        out = torch.empty(batch * qlen, heads, width, dtype=torch.float16)
        lse = torch.empty(batch * qlen, heads)
        with fast_launch.recording() as records:
            launchers._merge_segments_anew(*partials, segments, out, lse, invariant)
        (kernel, grid, _, options), = records
        return grid[1], options["BLOCK_D"], options["CHUNK"], options["num_warps"]

    few, many = tiles_of(1, 45, True), tiles_of(40, 45, True)
    assert few == many == (1, 512, 16, 4)
    assert tiles_of(1, 4, True)[1:3] == (512, 4)
    assert tiles_of(1, 45, False)[1] < 512
    assert tiles_of(40, 45, False) == (1, 512, 16, 4), "the default mode's whole rows: 16 items a step too"
