"""Writing a step's tokens into each DCP rank's cache (mla_dcp.cache_slots, mla_dcp.write_cache)."""

import dataclasses

import pytest
import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp.testing import assert_close_special

DL, DR, HEADS = 32, 16, 4


def config(qlen, world=1, rank=0, interleave=1, block=16, max_len=256, **kw):
    return mla_dcp.VerifyConfig(num_heads=HEADS, qlen=qlen, block_size=block, max_model_len=max_len,
                                dcp_world_size=world, dcp_rank=rank, interleave=interleave, kv_lora_rank=DL,
                                rope_dim=DR, softmax_scale=0.3, **kw)


def reference_slots(seq_lens, table, cfg):
    """DESIGN.md stage 1 by a loop: each row's token, its owner rank and local position, its slot."""
    world, interleave, block = cfg.dcp_world_size, cfg.interleave, cfg.block_size
    slots = []
    for b, length in enumerate(seq_lens):
        for t in range(cfg.qlen):
            p = length - cfg.qlen + t
            if p < 0 or p >= cfg.max_model_len or (p // interleave) % world != cfg.dcp_rank:
                slots.append(-1)
                continue
            j = (p // (world * interleave)) * interleave + p % interleave
            slots.append(table[b][j // block] * block + j % block)
    return slots


def test_slots_follow_the_placement_rule_on_random_steps():
    g = torch.Generator().manual_seed(0)
    for case in range(200):
        world = int(torch.randint(1, 5, (1,), generator=g))
        cfg = config(int(torch.randint(1, 5, (1,), generator=g)), world=world,
                     rank=int(torch.randint(0, world, (1,), generator=g)),
                     interleave=int(torch.randint(1, 4, (1,), generator=g)),
                     block=[1, 2, 16, 64][int(torch.randint(0, 4, (1,), generator=g))], max_len=200)
        batch = int(torch.randint(0, 5, (1,), generator=g))
        # Lengths below qlen (rows before the first position), 0, up to the bound and past it.
        seq_lens = torch.randint(0, 206, (batch,), generator=g, dtype=torch.int32)
        table = torch.randint(0, 1000, (batch, cfg.min_table_blocks + 1), generator=g, dtype=torch.int32)
        got = mla_dcp.cache_slots(cfg, seq_lens, table)
        assert got.dtype == torch.int64
        assert got.tolist() == reference_slots(seq_lens.tolist(), table.tolist(), cfg), (case, cfg)


def test_every_token_lands_on_exactly_one_rank():
    seq_lens = torch.tensor([0, 1, 7, 33, 64], dtype=torch.int32)
    for world, interleave in [(2, 1), (3, 2), (4, 16)]:
        held = sum((mla_dcp.cache_slots(config(4, world, r, interleave, max_len=64), seq_lens,
                                        torch.zeros(5, 8, dtype=torch.int32)) >= 0).int() for r in range(world))
        # Each row with a position below the bound, on one rank; the rows before position 0 on none.
        want = torch.tensor([[int(0 <= n - 4 + t < 64) for t in range(4)] for n in seq_lens.tolist()]).flatten()
        assert torch.equal(held, want), (world, interleave)


@pytest.mark.parametrize("world,interleave,ragged", [(1, 1, False), (3, 2, False), (2, 1, True), (4, 3, True)])
def test_a_cache_written_step_by_step_is_what_verify_reads(world, interleave, ragged):
    """Caches of NaN written only through cache_slots + write_cache, a few tokens a step (uniform or
    ragged counts), then verified on every rank and merged: equal to attention in global
    coordinates (a token in a wrong slot or on a wrong rank is a NaN read or a wrong key)."""
    g = torch.Generator().manual_seed(world)
    qlen, block, lengths = 3, 4, [29, 0, 61, 7]
    batch = len(lengths)
    keys = [torch.randn(n, DL + DR, generator=g) for n in lengths]
    cfgs = [config(qlen, world, r, interleave, block=block, max_len=64) for r in range(world)]
    blocks_per_rank = batch * cfgs[0].min_table_blocks
    tables = [torch.randperm(blocks_per_rank, generator=g).to(torch.int32).view(batch, -1) for _ in cfgs]
    caches = [torch.full((blocks_per_rank, block, DL + DR), float("nan")) for _ in cfgs]
    done = [0] * batch
    while done != lengths:
        counts = [min(n - d, qlen if not ragged else int(torch.randint(0, qlen + 1, (1,), generator=g)))
                  for n, d in zip(lengths, done)]
        if ragged:
            starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist())
            blocks = mla_dcp.ragged_blocks(starts, qlen, int(starts[-1]) + 1)      # one padding token
            latent = torch.cat([k[d:d + c] for k, d, c in zip(keys, done, counts)] + [torch.zeros(1, DL + DR)])
            seq_lens = torch.tensor([d + c for d, c in zip(done, counts)], dtype=torch.int32)
        else:
            counts = [qlen if n - d >= qlen else n - d for n, d in zip(lengths, done)]
            blocks = None
            # Uniform rows: request b's rows are its positions seq_len - qlen .. seq_len - 1, those
            # before its first new token repeating keys already written (the same values again).
            seq_lens = torch.tensor([max(d + c, 0) for d, c in zip(done, counts)], dtype=torch.int32)
            latent = torch.cat([torch.cat([torch.zeros(max(qlen - n, 0), DL + DR), k[max(n - qlen, 0):n]])
                                for k, n in zip(keys, seq_lens.tolist())])
        for cfg, table, cache in zip(cfgs, tables, caches):
            mla_dcp.write_cache(cache, mla_dcp.cache_slots(cfg, seq_lens, table, blocks=blocks), latent)
        done = [d + c for d, c in zip(done, counts)]
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(batch * qlen, HEADS, DL + DR, generator=g)
    partials = [mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table), q, cache)
                for cfg, table, cache in zip(cfgs, tables, caches)]
    out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
    global_kv = torch.stack([torch.cat([k, torch.zeros(max(lengths) - k.shape[0], DL + DR)]) for k in keys])
    want_out, want_lse = pure.reference_attention(q, global_kv, seq_lens, qlen=qlen, kv_lora_rank=DL,
                                                  softmax_scale=cfgs[0].scale)
    assert_close_special("out", out, want_out, 1e-4)
    assert_close_special("lse", lse, want_lse, 1e-4)
    # Each written key once, on its own rank; the rest of every cache untouched.
    assert sum(int((~cache.isnan().all(-1)).sum()) for cache in caches) == sum(lengths)


def test_an_fp8_cache_stores_the_scaled_saturated_values():
    cfg = config(2, block=4, max_len=16)
    cache = torch.zeros(4, 4, DL + DR, dtype=torch.float8_e4m3fn)
    scale = torch.tensor([0.5])
    latent = torch.randn(2, DL + DR)
    latent[0, 0], latent[0, 1], latent[1, 2] = 1000.0, -1000.0, float("nan")
    slots = mla_dcp.cache_slots(cfg, torch.tensor([6], dtype=torch.int32), torch.tensor([[2, 1, 0, 3]],
                                                                                        dtype=torch.int32))
    assert slots.tolist() == [4, 5]                     # positions 4, 5: the table's second block, id 1
    mla_dcp.write_cache(cache, slots, latent, scale)
    stored = cache.view(-1, DL + DR)[4:6].float()
    assert stored[0, 0] == 448 and stored[0, 1] == -448 and stored[1, 2].isnan()
    want = (latent / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(stored.nan_to_num(), want.nan_to_num())
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[4:6] = False
    assert cache.view(-1, DL + DR)[untouched].float().eq(0).all()


def test_a_compiled_write_equals_the_eager_one():
    torch._dynamo.reset()
    cfg = config(3, world=2, rank=1, interleave=2, block=4, max_len=64)
    table = torch.randperm(32).to(torch.int32).view(2, 16)
    latent = torch.randn(6, DL + DR)

    def write(cache, seq_lens):
        mla_dcp.write_cache(cache, mla_dcp.cache_slots(cfg, seq_lens, table), latent)
        return cache

    compiled = torch.compile(write, fullgraph=True)
    for lens in ([9, 40], [12, 3]):
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        eager = write(torch.zeros(32, 4, DL + DR), seq_lens)
        got = compiled(torch.zeros(32, 4, DL + DR), seq_lens)
        assert torch.equal(got, eager) and eager.ne(0).any()


def test_the_op_passes_opcheck():
    from mla_dcp.ops import library as ops

    slots = torch.tensor([3, -1, 0, 7])
    torch.library.opcheck(ops.write_cache, (torch.zeros(2, 4, 8), slots, torch.randn(4, 8), None))
    torch.library.opcheck(ops.write_cache, (torch.zeros(2, 4, 8, dtype=torch.float8_e4m3fn), slots,
                                            torch.randn(4, 8), torch.tensor([0.25])),
                          test_utils=("test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("call,message", [
    (lambda c, s, l, t: mla_dcp.cache_slots(c, t.long()[:, 0], t), "seq_lens must have dtype torch.int32"),
    (lambda c, s, l, t: mla_dcp.cache_slots(c, t[:, 0], t[:, :1]), r"block_table must have at least 4 columns"),
    (lambda c, s, l, t: mla_dcp.cache_slots(c, t[:1, 0], t), r"block_table must have shape \[1, max_blocks\]"),
    (lambda c, s, l, t: mla_dcp.cache_slots(c, t[:, 0], t, blocks=mla_dcp.ragged_blocks(
        torch.tensor([0, 1, 2]), 2, 2)), "blocks must be mla_dcp.ragged_blocks.*qlen=3"),
    (lambda c, s, l, t: mla_dcp.write_cache(torch.zeros(2, 4, 48), s.int(), l), "slots must have dtype torch.int64"),
    (lambda c, s, l, t: mla_dcp.write_cache(torch.zeros(2, 4, 40), s, l), r"latent must have shape \[6, 40\]"),
    (lambda c, s, l, t: mla_dcp.write_cache(torch.zeros(2, 4, 48, dtype=torch.float8_e4m3fn), s, l),
     "kv_scale is required for an fp8 kv_cache"),
    (lambda c, s, l, t: mla_dcp.write_cache(torch.zeros(2, 48, 4).transpose(1, 2), s, l),
     "kv_cache must hold its rows at a unit inner stride"),
    (lambda c, s, l, t: mla_dcp.write_cache(torch.zeros(2, 4, 48, dtype=torch.float64), s, l),
     "kv_cache must have dtype"),
])
def test_bad_input_is_named(call, message):
    cfg = config(3, world=2, block=16, max_len=128)
    with pytest.raises((TypeError, ValueError), match=message):
        call(cfg, torch.zeros(6, dtype=torch.int64), torch.zeros(6, DL + DR), torch.zeros(2, 4, dtype=torch.int32))


def test_the_module_examples_run():
    import doctest

    import mla_dcp.cache

    assert doctest.testmod(mla_dcp.cache).failed == 0


def test_a_config_replace_keeps_the_rank_rule():
    # The slots follow cfg.dcp_rank: the same step on the other rank writes the other tokens.
    cfg = config(4, world=2, interleave=1, block=8, max_len=64)
    table = torch.arange(8, dtype=torch.int32).view(1, 8)
    mine = mla_dcp.cache_slots(cfg, torch.tensor([10], dtype=torch.int32), table)
    other = mla_dcp.cache_slots(dataclasses.replace(cfg, dcp_rank=1), torch.tensor([10], dtype=torch.int32), table)
    assert ((mine >= 0) ^ (other >= 0)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_the_gpu_write_equals_the_pure_one_and_replays_in_a_graph(kv):
    """The write's kernel against the pure path, no host sync, and one captured graph of
    cache_slots + write_cache replayed after the lengths change."""
    from mla_dcp.testing import platform_fp8

    cache_dtype = platform_fp8() if kv == "fp8" else torch.bfloat16
    scale = torch.tensor([0.25], device="cuda") if kv == "fp8" else None
    cfg = config(4, world=2, rank=1, interleave=2, block=16, max_len=512)
    table = torch.randperm(64, device="cuda").to(torch.int32).view(2, 32)
    seq_lens = torch.tensor([37, 300], dtype=torch.int32, device="cuda")
    latent = torch.randn(8, DL + DR, device="cuda", dtype=torch.bfloat16) * 4
    latent[1, 2] = float("nan")

    def write(cache):
        mla_dcp.write_cache(cache, mla_dcp.cache_slots(cfg, seq_lens, table), latent, scale)

    got = torch.zeros(64, 16, DL + DR, device="cuda").to(cache_dtype)
    write(got)
    want = torch.zeros(64, 16, DL + DR).to(cache_dtype)
    pure.write_cache(want, pure.cache_slots(seq_lens.cpu(), table.cpu(), 4, 2, 1, 2, 16, 512), latent.cpu(),
                     None if scale is None else scale.cpu())
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        write(got)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cache = torch.zeros_like(got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write(cache)
    seq_lens.copy_(torch.tensor([4, 511], dtype=torch.int32))
    graph.replay()
    want = torch.zeros(64, 16, DL + DR).to(cache_dtype)
    pure.write_cache(want, pure.cache_slots(seq_lens.cpu(), table.cpu(), 4, 2, 1, 2, 16, 512), latent.cpu(),
                     None if scale is None else scale.cpu())
    assert torch.equal(cache.cpu().view(torch.uint8), want.view(torch.uint8))
