"""Ragged verify blocks (mla_dcp.ragged): requests with different numbers of
query tokens, packed as an engine sends them, verified in one step."""

import dataclasses

import pytest
import torch

import mla_dcp
from mla_dcp.pure.reference import reference_attention
from mla_dcp.testing import (assert_close_special, check_compiled_follows, check_graph_follows, make_problem,
                             poison_key)

SMALL = dict(num_heads=4, kv_lora_rank=32, rope_dim=16)
QLEN = 4
# Tokens per request: one request with a full block, one with none, the rest between.
COUNTS = [1, 4, 0, 2, 3]
LENGTHS = [40, 131, 17, 96, 250]


def starts_of(counts, dtype=torch.int64, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_tokens_take_the_last_rows_of_their_block_and_come_back(dtype):
    starts = starts_of([1, 3, 0, 2], dtype)
    q = torch.arange(1.0, 8.0)[:, None, None].expand(7, 2, 3)          # 6 tokens, then a padding token
    blocks = mla_dcp.ragged_blocks(starts, qlen=3, num_tokens=7)
    rows = blocks.rows(q)
    assert rows[:, 0, 0].tolist() == [0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 5, 6]
    assert torch.equal(rows, rows[:, :1, :1].expand(-1, 2, 3))
    lse = rows[:, :, 0] * 10
    out, got_lse = blocks.tokens(rows, lse)
    assert torch.equal(out[:6], q[:6]) and torch.equal(got_lse[:6], q[:6, :, 0] * 10)
    # The padding token past the last request: an empty row's answer.
    assert torch.equal(out[6], torch.zeros(2, 3)) and bool(got_lse[6].isneginf().all())


def reference_map(starts, qlen, num_tokens):
    """The maps by a loop over each request's tokens (shares no formula with pure.ragged_map)."""
    batch = len(starts) - 1
    token_of_row, row_of_token = [-1] * (batch * qlen), [-1] * num_tokens
    for b in range(batch):
        count = starts[b + 1] - starts[b]
        for j in range(count):
            token = starts[b] + j
            if count - j > qlen:            # more tokens than rows: the earliest have none
                row_of_token[token] = -2
            else:
                row = b * qlen + qlen - count + j
                token_of_row[row], row_of_token[token] = token, row
    return token_of_row, row_of_token


def test_the_map_equals_a_loop_over_random_batches():
    from mla_dcp import pure

    g = torch.Generator().manual_seed(0)
    for case in range(300):
        batch = int(torch.randint(0, 7, (1,), generator=g))
        qlen = int(torch.randint(1, 6, (1,), generator=g))
        counts = torch.randint(0, qlen + 2, (batch,), generator=g).tolist()    # some over qlen
        first = int(torch.randint(0, 3, (1,), generator=g))                    # tokens before the first
        pad = int(torch.randint(0, 4, (1,), generator=g))                      # and after the last
        starts = [first] + [first + sum(counts[:b + 1]) for b in range(batch)]
        total = starts[-1] + pad
        for dtype in (torch.int32, torch.int64):
            token_of_row, row_of_token = pure.ragged_map(torch.tensor(starts, dtype=dtype), qlen, total)
            assert token_of_row.dtype == row_of_token.dtype == torch.int32
            assert (token_of_row.tolist(), row_of_token.tolist()) == reference_map(starts, qlen, total), \
                (case, starts, qlen, total)


def test_tokens_before_the_first_start_are_padding():
    starts = torch.tensor([2, 4])
    q = torch.arange(1.0, 6.0)[:, None]
    blocks = mla_dcp.ragged_blocks(starts, qlen=3, num_tokens=5)
    assert blocks.rows(q).flatten().tolist() == [0, 3, 4]
    out, lse = blocks.tokens(torch.tensor([[7.0], [8.0], [9.0]]), torch.tensor([1.0, 2.0, 3.0]))
    assert out.flatten().tolist()[2:4] == [8, 9] and lse.tolist()[2:4] == [2, 3]
    assert out[[0, 1, 4]].eq(0).all() and lse[[0, 1, 4]].isneginf().all()


def test_a_request_longer_than_qlen_gives_nan_never_a_neighbours_answer():
    """Request 1 has 5 tokens and qlen is 3: its first two have no row. Read
    back by position they would land on request 0's rows (a silently wrong
    answer); they come back NaN, like a poisoned row, and checked mode names
    the request."""
    starts = torch.tensor([0, 2, 7])
    q = torch.arange(1.0, 8.0)[:, None]
    blocks = mla_dcp.ragged_blocks(starts, qlen=3, num_tokens=7)
    rows = blocks.rows(q)
    assert rows.flatten().tolist() == [0, 1, 2, 5, 6, 7]
    out, lse = blocks.tokens(rows, rows[:, 0])
    assert out.flatten()[:2].tolist() == [1, 2] and out.flatten()[4:].tolist() == [5, 6, 7]
    assert out[2:4].isnan().all() and lse[2:4].isnan().all()
    with pytest.raises(ValueError, match=r"request 1 5 tokens \(query_start_loc\[2\] - query_start_loc\[1\]\); "
                                         r"a request may have at most qlen=3"):
        mla_dcp.ragged_blocks(starts, qlen=3, num_tokens=7, check=True)


def ragged_problem(dtype=torch.float32, world=3, interleave=2, causal=True, invariant=False):
    problem = make_problem(LENGTHS, qlen=QLEN, world=world, interleave=interleave, block_size=16,
                           max_model_len=256, dtype=dtype, causal=causal, seed=3, **SMALL)
    if invariant:
        for shard in problem.shards:
            shard.cfg = dataclasses.replace(shard.cfg, batch_invariant=True, invariant_segment_tokens=128)
    # Each request's real tokens: the last of its block's rows in the problem's queries.
    tokens = torch.cat([problem.q[b * QLEN + QLEN - n:(b + 1) * QLEN] for b, n in enumerate(COUNTS)])
    return problem, tokens


def ragged_step(problem, tokens, starts, pad=0):
    """The engine's view: packed tokens (``pad`` padding tokens after them) in,
    every rank verifies its rows, the ranks merge, packed tokens out."""
    packed = torch.cat([tokens, torch.full((pad, *tokens.shape[1:]), float("nan"), dtype=tokens.dtype)])
    blocks = mla_dcp.ragged_blocks(starts, QLEN, packed.shape[0])
    rows = blocks.rows(packed)
    partials = []
    for shard in problem.shards:
        view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table, q_dtype=rows.dtype)
        partials.append(mla_dcp.verify(shard.cfg, view, rows, shard.kv_cache))
    out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
    return blocks.tokens(out, lse)


def token_reference(problem, tokens, causal=True):
    """Each request's tokens as its own block of ``q_b`` rows in global coordinates:
    no row mapping shared with the library."""
    cfg = problem.shards[0].cfg
    outs, lses, at = [], [], 0
    for b, n in enumerate(COUNTS):
        if n:
            out, lse = reference_attention(tokens[at:at + n], problem.global_kv[b:b + 1], problem.seq_lens[b:b + 1],
                                           qlen=n, kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale,
                                           causal=causal)
            outs.append(out)
            lses.append(lse)
            at += n
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("causal", [True, False])
def test_a_ragged_step_over_ranks_equals_each_request_as_its_own_block(causal):
    problem, tokens = ragged_problem(causal=causal)
    # A NaN key at request 3's last position: only its last token sees it.
    poison_key(problem, 3, LENGTHS[3] - 1, slice(0, 1), float("nan"))
    starts = starts_of(COUNTS)
    out, lse = ragged_step(problem, tokens, starts, pad=2)
    want_out, want_lse = token_reference(problem, tokens, causal)
    real = sum(COUNTS)
    assert_close_special("out", out[:real], want_out, 1e-4)
    assert_close_special("lse", lse[:real], want_lse, 1e-4)
    # Request 3's tokens are 5 and 6 of the packed 10: the last poisoned, its first only under causal.
    assert bool(out[6].isnan().all()) and bool(out[5].isnan().all()) == (not causal)
    assert not out[4].isnan().any()
    assert out[real:].eq(0).all() and lse[real:].isneginf().all()


def _ranks_check(rank, world):
    from mla_dcp import distributed

    problem = make_problem(LENGTHS, qlen=QLEN, world=world, interleave=2, block_size=16, max_model_len=256,
                           ranks=[rank], seed=3, **SMALL)
    tokens = torch.cat([problem.q[b * QLEN + QLEN - n:(b + 1) * QLEN] for b, n in enumerate(COUNTS)])
    shard = problem.shards[0]
    blocks = mla_dcp.ragged_blocks(starts_of(COUNTS), QLEN, tokens.shape[0])
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    want_out, want_lse = token_reference(problem, tokens)
    heads = slice(rank * SMALL["num_heads"] // world, (rank + 1) * SMALL["num_heads"] // world)
    for method in distributed.METHODS:
        out, lse = blocks.tokens(*distributed.verify(shard.cfg, view, blocks.rows(tokens), shard.kv_cache,
                                                     method=method))
        whole = method == "all_reduce"
        assert_close_special(f"{method} out", out, want_out if whole else want_out[:, heads], 1e-4)
        assert_close_special(f"{method} lse", lse, want_lse if whole else want_lse[:, heads], 1e-4)


def test_ragged_blocks_through_each_merge_over_real_ranks():
    """Each rank a process (gloo): the rows in, each collective merge, this rank's heads (or all)
    back as tokens."""
    from mla_dcp.testing import launch_group

    launch_group(_ranks_check, 2, backend="gloo")


def test_invariant_mode_a_token_has_the_bits_of_its_request_verified_alone(many_threads):
    problem, tokens = ragged_problem(invariant=True, world=2, interleave=1)
    out, lse = ragged_step(problem, tokens, starts_of(COUNTS))
    at = 0
    for b, n in enumerate(COUNTS):
        if not n:
            continue
        partials = []
        for shard in problem.shards:
            cfg = dataclasses.replace(shard.cfg, qlen=n)
            seq, table = problem.seq_lens[b:b + 1], shard.block_table[b:b + 1]
            partials.append(mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq, table, q_dtype=tokens.dtype),
                                           tokens[at:at + n], shard.kv_cache))
        alone = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
        assert torch.equal(out[at:at + n], alone[0]) and torch.equal(lse[at:at + n], alone[1]), b
        at += n


def test_a_compiled_ragged_step_keeps_one_graph_while_the_counts_change():
    problem, tokens = ragged_problem(world=1, interleave=1)
    shard = problem.shards[0]
    cfg = shard.cfg

    def step(packed, starts, seq_lens):
        blocks = mla_dcp.ragged_blocks(starts, QLEN, packed.shape[0])
        rows = blocks.rows(packed)
        out, lse = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=rows.dtype),
                                  rows, shard.kv_cache)
        return blocks.tokens(out, lse)

    real = sum(COUNTS)
    check_compiled_follows(step, [(tokens, starts_of(counts), problem.seq_lens)
                                  for counts in (COUNTS, [4, 0, 3, 1, 2], [2, 2, 2, 2, real - 8])])


def test_the_ops_pass_opcheck():
    from mla_dcp import pure
    from mla_dcp.ops import library as ops

    # Every kind of row and token but one no row holds: that one's NaN would fail opcheck's equality
    # (the NaN rule is the tests' above and the kernels').
    starts = torch.tensor([0, 1, 4, 4, 8])
    token_of_row, row_of_token = pure.ragged_map(starts, 4, 10)
    assert (row_of_token == pure.RAGGED_NO_REQUEST).any() and (token_of_row == -1).any()
    q = torch.randn(10, 3, 8)
    out, lse = torch.randn(16, 3, 5), torch.randn(16, 3)
    for op, args in ((ops.ragged_rows, (q, token_of_row)), (ops.ragged_tokens, (out, lse, row_of_token))):
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("call,message", [
    (lambda q, s, b: mla_dcp.ragged_blocks(s.float(), 4, 8), "query_start_loc must have dtype torch.int32 or torch.int64"),
    (lambda q, s, b: mla_dcp.ragged_blocks(s[None], 4, 8), r"query_start_loc must have shape \[B \+ 1\]"),
    (lambda q, s, b: mla_dcp.ragged_blocks(s[:0], 4, 8), r"query_start_loc must have shape \[B \+ 1\].*got \[0\]"),
    (lambda q, s, b: mla_dcp.ragged_blocks(s, 0, 8), "qlen must be an int >= 1 .*got 0"),
    (lambda q, s, b: mla_dcp.ragged_blocks(s, 4, -1), "num_tokens must be an int >= 0"),
    (lambda q, s, b: b.rows(q.to("meta")), "blocks must be on the same device as q"),
    (lambda q, s, b: b.rows(q[:7]), r"q must have shape \[T, ...\] with T = 8 .*got \[7, 2, 3\]"),
    (lambda q, s, b: b.rows(q[0, 0, 0]), r"q must have shape \[T, ...\]"),
    (lambda q, s, b: b.tokens(q[:7], q[:12, :, 0]), r"out must have shape \[B\*qlen, ...\] with B\*qlen = 12"),
    (lambda q, s, b: b.tokens(q.new_zeros(12, 2), q[:5, :, 0]), r"lse must have shape \[B\*qlen, ...\] with B\*qlen = 12"),
    (lambda q, s, b: mla_dcp.ragged_blocks(torch.tensor([0, 3, 2, 5]), 4, 8, check=True),
     r"query_start_loc\[2\] must be >= the entry before it"),
    (lambda q, s, b: mla_dcp.ragged_blocks(torch.tensor([0, 3, 4, 9]), 4, 8, check=True),
     r"query_start_loc\[3\] must be in \[0, num_tokens=8\], got 9"),
])
def test_bad_input_is_named(call, message):
    q = torch.zeros(8, 2, 3)
    starts = torch.tensor([0, 2, 3, 5])
    with pytest.raises((TypeError, ValueError), match=message):
        call(q, starts, mla_dcp.ragged_blocks(starts, 4, 8))


def test_checked_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("MLA_DCP_CHECK", "1")
    with pytest.raises(ValueError, match="request 0 5 tokens"):
        mla_dcp.ragged_blocks(torch.tensor([0, 5]), 3, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_a_captured_ragged_step_follows_the_counts(dtype):
    """One CUDA graph: the counts and lengths change between replays, each
    replay equals the eager step (and the eager step the reference)."""
    problem = make_problem(LENGTHS, qlen=QLEN, world=2, interleave=1, block_size=64, max_model_len=4096,
                           dtype=dtype, num_heads=16, kv_lora_rank=512, rope_dim=64, seed=3, device="cuda")
    shard = problem.shards[1]
    cfg = shard.cfg
    tokens = torch.cat([problem.q[b * QLEN + QLEN - n:(b + 1) * QLEN] for b, n in enumerate(COUNTS)])
    starts = starts_of(COUNTS, torch.int32, "cuda")
    seq_lens = problem.seq_lens.clone()

    def step():
        blocks = mla_dcp.ragged_blocks(starts, QLEN, tokens.shape[0])
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=dtype)
        out, lse = mla_dcp.verify(cfg, view, blocks.rows(tokens), shard.kv_cache)
        return blocks.tokens(out, lse)

    # The GPU's two kernels against the pure path (what the CPU and a compiled step run).
    blocks = mla_dcp.ragged_blocks(starts, QLEN, tokens.shape[0])
    rows = blocks.rows(tokens)
    torch.testing.assert_close(rows, mla_dcp.pure.ragged_rows(tokens, blocks.token_of_row), rtol=0, atol=0)
    out, lse = torch.randn(rows.shape[0], 16, 512, device="cuda", dtype=dtype), torch.randn(rows.shape[0], 16,
                                                                                             device="cuda")
    torch.testing.assert_close(blocks.tokens(out, lse), mla_dcp.pure.ragged_tokens(out, lse, blocks.row_of_token),
                               rtol=0, atol=0, equal_nan=True)

    def update(counts, lens):
        return lambda: (starts.copy_(starts_of(counts, torch.int32, "cuda")),
                        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32)))

    # The map, both moves and the step: no host sync; one graph follows the counts and lengths.
    check_graph_follows(step, [update(COUNTS, LENGTHS), update([4, 0, 3, 1, 2], [38, 0, 17, 90, 200]),
                               update([2, 2, 2, 2, 2], [3, 9, 2, 96, 250])])


def test_the_module_examples_run():
    import doctest

    import mla_dcp.ragged

    assert doctest.testmod(mla_dcp.ragged).failed == 0
