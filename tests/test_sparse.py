"""Token-sparse verify rows (DeepSeek Sparse Attention): mla_dcp.verify_sparse."""

import dataclasses

import pytest
import torch

import mla_dcp
from mla_dcp.pure.reference import reference_attention
from mla_dcp.testing import (assert_close_special, check_compiled_follows, make_problem, merge_partials, platform_fp8,
                             poison_key)

SMALL = dict(num_heads=4, kv_lora_rank=16, rope_dim=8)
LENS = [0, 1, 2, 7, 40, 130]


def random_indices(seq_lens, qlen, topk, seed, causal=True):
    """Each row's selection: up to ``topk`` distinct positions of its window in random order, the
    rest -1 (a short window lists fewer). Returns (indices int32 [B*qlen, topk], row mask
    bool [B, qlen, max_len] for the reference)."""
    g = torch.Generator().manual_seed(seed)
    lens = [int(n) for n in seq_lens]
    longest = max(lens + [1])
    indices = torch.full((len(lens) * qlen, topk), -1, dtype=torch.int32)
    mask = torch.zeros(len(lens), qlen, longest, dtype=torch.bool)
    for b, n in enumerate(lens):
        for t in range(qlen):
            window = max(0, n - (qlen - 1 - t)) if causal else n
            count = min(topk, window, int(torch.randint(0, topk + 1, (1,), generator=g)) + window // 3)
            chosen = torch.randperm(window, generator=g)[:count]
            slots = torch.randperm(topk, generator=g)[:count]
            indices[b * qlen + t, slots] = chosen.to(torch.int32)
            mask[b, t, chosen] = True
    return indices, mask


def sparse_step(problem, indices, cfg_of=lambda cfg: cfg):
    partials = []
    for shard in problem.shards:
        cfg = cfg_of(shard.cfg)
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table, q_dtype=problem.q.dtype)
        partials.append(mla_dcp.verify_sparse(cfg, view, problem.q, shard.kv_cache, indices, problem.kv_scale))
    return partials


def reference_of(problem, mask, rank=None, dtype=torch.float64):
    cfg = problem.shards[0].cfg
    key_mask = None
    if rank is not None:
        from mla_dcp.testing import deal_positions
        max_len = problem.global_kv.shape[1]
        owned = torch.zeros(max_len, dtype=torch.bool)
        owned[list(deal_positions(max_len, cfg.dcp_world_size, cfg.interleave)[rank])] = True
        key_mask = owned[None, :].expand(problem.global_kv.shape[0], -1)
    return reference_attention(problem.q, problem.global_kv, problem.seq_lens, qlen=cfg.qlen,
                               kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale, kv_scale=None,
                               key_mask=key_mask, dtype=dtype, causal=cfg.causal, row_mask=mask)


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (2, 4), (3, 2), (8, 3)])
@pytest.mark.parametrize("qlen,causal", [(1, True), (3, True), (4, False)])
def test_sparse_rows_match_the_global_reference(world, interleave, qlen, causal):
    """Per rank and merged, against attention in global coordinates over each row's selected
    positions, on caches with NaN in every slot a rank must not read."""
    problem = make_problem(LENS, qlen=qlen, world=world, interleave=interleave, block_size=16, max_model_len=160,
                           causal=causal, seed=world * 7 + qlen, **SMALL)
    indices, mask = random_indices(LENS, qlen, 24, world + qlen, causal)
    partials = sparse_step(problem, indices)
    for rank, (out, lse) in enumerate(partials):
        want_out, want_lse = reference_of(problem, mask, rank)
        assert_close_special(f"rank {rank} out", out, want_out, 1e-4)
        assert_close_special(f"rank {rank} lse", lse, want_lse, 1e-4)
    out, lse = merge_partials(partials)
    want_out, want_lse = reference_of(problem, mask)
    assert_close_special("out", out, want_out, 1e-4)
    assert_close_special("lse", lse, want_lse, 1e-4)


def test_every_position_listed_gives_the_dense_answer():
    """A row that lists its whole window is the dense verify row."""
    problem = make_problem(LENS, qlen=3, world=2, interleave=2, block_size=16, max_model_len=160, **SMALL)
    indices, _ = random_indices(LENS, 3, 160, 0)
    whole = torch.full_like(indices, -1)
    for b, n in enumerate(LENS):
        for t in range(3):
            window = max(0, n - (2 - t))
            whole[b * 3 + t, :window] = torch.randperm(window).to(torch.int32)
    dense = merge_partials([mla_dcp.verify(s.cfg, mla_dcp.build_view(s.cfg, problem.seq_lens, s.block_table),
                                           problem.q, s.kv_cache) for s in problem.shards])
    sparse = merge_partials(sparse_step(problem, whole))
    for name, got, want in zip(("out", "lse"), sparse, dense):
        assert_close_special(name, got, want, 1e-5)


@pytest.mark.parametrize("dtype,kv", [(torch.bfloat16, None), (torch.float16, "fp8")])
def test_16_bit_and_fp8_caches(dtype, kv):
    from mla_dcp.testing import error_budget

    kv_dtype = platform_fp8() if kv else None
    problem = make_problem(LENS, qlen=2, world=3, interleave=1, block_size=16, max_model_len=160, dtype=dtype,
                           kv_dtype=kv_dtype, seed=4, **SMALL)
    indices, mask = random_indices(LENS, 2, 32, 4)
    out, lse = merge_partials(sparse_step(problem, indices))
    exact_out, exact_lse = reference_of(problem, mask)
    budget = error_budget(exact_out, reference_of(problem, mask, dtype=dtype)[0], dtype)
    assert out.dtype == dtype
    assert_close_special("out", out, exact_out, budget)
    assert_close_special("lse", lse, exact_lse, max(1e-3, budget))


def test_nan_poisons_only_the_rows_that_list_it_and_a_position_past_the_window_is_not_read():
    problem = make_problem([40, 50], qlen=2, world=2, interleave=1, block_size=16, max_model_len=64, **SMALL)
    indices = torch.full((4, 8), -1, dtype=torch.int32)
    indices[0, :3] = torch.tensor([0, 5, 30])
    indices[1, :3] = torch.tensor([1, 5, 39])
    indices[2, :2] = torch.tensor([7, 20])
    indices[3, :2] = torch.tensor([8, 21])
    poison_key(problem, 0, 30, slice(0, 3), float("nan"))       # listed by row 0 only
    poison_key(problem, 1, 9, slice(0, 3), float("nan"))        # listed by no row
    out, lse = merge_partials(sparse_step(problem, indices))
    assert out[0].isnan().all() and lse[0].isnan().all()
    assert not out[1:].isnan().any() and not lse[1:].isnan().any()
    # Request 1's row 0 sees positions up to 48: 49 (its next row's) and 55 (past the request)
    # listed there are not read, as the causal mask excludes them from the model's own attention.
    past = indices.clone()
    past[2, 2:4] = torch.tensor([49, 55])
    poison_key(problem, 1, 49, slice(0, 3), float("nan"))
    got = merge_partials(sparse_step(problem, past))
    for name, a, b in zip(("out", "lse"), got, (out, lse)):
        assert torch.equal(a[2], b[2]), name


def test_a_row_listing_nothing_here_is_empty():
    problem = make_problem([40], qlen=1, world=2, interleave=1, block_size=16, max_model_len=64, **SMALL)
    indices = torch.tensor([[4, 10, -1, 22]], dtype=torch.int32)          # even positions: all on rank 0
    (out0, lse0), (out1, lse1) = sparse_step(problem, indices)
    assert torch.isfinite(lse0).all() and out1.eq(0).all() and lse1.isneginf().all()


def test_invariant_mode_a_row_has_the_bits_of_its_request_alone(many_threads):
    problem = make_problem(LENS, qlen=3, world=2, interleave=1, block_size=16, max_model_len=160, seed=2,
                           **SMALL)
    indices, _ = random_indices(LENS, 3, 20, 2)
    for shard in problem.shards:
        cfg = dataclasses.replace(shard.cfg, batch_invariant=True, invariant_segment_tokens=128)
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
        out, lse = mla_dcp.verify_sparse(cfg, view, problem.q, shard.kv_cache, indices)
        for b in range(len(LENS)):
            rows = slice(b * 3, (b + 1) * 3)
            alone = mla_dcp.verify_sparse(
                cfg, mla_dcp.build_view(cfg, problem.seq_lens[b:b + 1], shard.block_table[b:b + 1]),
                problem.q[rows], shard.kv_cache, indices[rows])
            assert torch.equal(out[rows], alone[0]) and torch.equal(lse[rows], alone[1]), b


def test_a_compiled_sparse_step_keeps_one_graph_while_lengths_and_indices_change():
    problem = make_problem(LENS, qlen=2, world=2, interleave=1, block_size=16, max_model_len=160, seed=6, **SMALL)
    shard = problem.shards[0]
    cfg = shard.cfg

    def step(q, seq_lens, indices):
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype)
        return mla_dcp.verify_sparse(cfg, view, q, shard.kv_cache, indices)

    cases = []
    for seed, shift in ((0, 0), (1, -1), (2, -9)):
        seq_lens = (problem.seq_lens + shift).clamp(0, 160).to(torch.int32)
        cases.append((problem.q, seq_lens, random_indices(seq_lens.tolist(), 2, 16, seed)[0]))
    check_compiled_follows(step, cases)


def test_the_sparse_op_passes_opcheck():
    from mla_dcp.ops import library as ops

    problem = make_problem([0, 5, 40], qlen=2, world=2, interleave=1, block_size=16, max_model_len=48, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    indices, _ = random_indices([0, 5, 40], 2, 8, 1)
    torch.library.opcheck(ops.sparse_attention, (problem.q, torch.nan_to_num(shard.kv_cache), None, view.row_lens,
                                                 view.page_table, indices, 2, 2, 0, 1, 16, 0.3, False))


@pytest.mark.parametrize("indices,error,message", [
    (lambda i: i.long(), TypeError, "indices must have dtype torch.int32, got torch.int64"),
    (lambda i: i[:5], ValueError, r"indices must have shape \[B\*qlen, topk\] = \[12, topk\] with topk >= 1, got \[5, 8\]"),
    (lambda i: i[:, :0], ValueError, r"got \[12, 0\]"),
    (lambda i: i.to("meta"), ValueError, "indices must be on the same device as q"),
])
def test_bad_indices_are_named_before_any_work(indices, error, message):
    problem = make_problem(LENS, qlen=2, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    good, _ = random_indices(LENS, 2, 8, 0)
    with pytest.raises(error, match=message):
        mla_dcp.verify_sparse(shard.cfg, view, problem.q, shard.kv_cache, indices(good))


def test_a_masked_view_is_refused_by_name():
    problem = make_problem(LENS, qlen=2, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table, block_mask=mla_dcp.tree_mask([-1, 0]))
    with pytest.raises(TypeError, match="verify_sparse takes the step's VerifyView .*got a MaskedView"):
        mla_dcp.verify_sparse(shard.cfg, view, problem.q, shard.kv_cache, random_indices(LENS, 2, 8, 0)[0])


def test_checked_mode_names_a_position_past_the_bound_and_a_repeated_one():
    problem = make_problem([40], qlen=1, max_model_len=64, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    with pytest.raises(ValueError, match=r"indices\[0, 1\] must be a position below max_model_len=64"):
        mla_dcp.verify_sparse(shard.cfg, view, problem.q, shard.kv_cache,
                              torch.tensor([[3, 64, -1]], dtype=torch.int32), check=True)
    with pytest.raises(ValueError, match=r"indices\[0\] lists position 7 twice"):
        mla_dcp.verify_sparse(shard.cfg, view, problem.q, shard.kv_cache,
                              torch.tensor([[7, -1, 7, -1]], dtype=torch.int32), check=True)


def _sparse_ranks_check(rank, world):
    from mla_dcp import distributed

    problem = make_problem(LENS, qlen=2, world=world, interleave=2, block_size=16, max_model_len=160, ranks=[rank],
                           seed=8, **SMALL)
    indices, mask = random_indices(LENS, 2, 24, 8)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    want_out, want_lse = reference_of(problem, mask)
    heads = slice(rank * SMALL["num_heads"] // world, (rank + 1) * SMALL["num_heads"] // world)
    for method in distributed.METHODS:
        out, lse = distributed.verify_sparse(shard.cfg, view, problem.q, shard.kv_cache, indices, method=method)
        whole = method == "all_reduce"
        assert_close_special(f"{method} out", out, want_out if whole else want_out[:, heads], 1e-4)
        assert_close_special(f"{method} lse", lse, want_lse if whole else want_lse[:, heads], 1e-4)


def test_sparse_partials_through_each_merge_over_real_ranks():
    from mla_dcp.testing import launch_group

    launch_group(_sparse_ranks_check, 2, backend="gloo")


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv", [(16, None), (128, None), (64, "fp8"), (64, "ds")])
def test_a_gpu_sparse_step_matches_the_pure_one_and_replays_in_a_graph(heads, kv):
    """The sparse kernel (bf16, per-tensor e4m3 and DeepSeek's fp8 layout) against the pure path
    within the data's budget, NaN in the same places, no host sync, one CUDA graph replayed with
    other lengths and other indices."""
    from mla_dcp import _fp8_ds_mla
    from mla_dcp.testing import check_graph_follows, error_budget

    kv_dtype = platform_fp8() if kv == "fp8" else None
    lens, qlen = [0, 9, 700, 3000, 130, 2049], 2
    problem = make_problem(lens, qlen=qlen, world=2, interleave=1, block_size=64, max_model_len=4096,
                           dtype=torch.bfloat16, kv_dtype=kv_dtype, num_heads=heads, kv_lora_rank=512, rope_dim=64,
                           seed=heads, device="cuda")
    shard = problem.shards[poison_key(problem, 3, 2000, slice(0, 4), float("nan"))]
    if kv == "ds":
        rows = shard.kv_cache.reshape(-1, shard.kv_cache.shape[-1])
        shard.kv_cache = _fp8_ds_mla.encode(rows, 512).view(*shard.kv_cache.shape[:2], -1)
    indices, _ = random_indices(lens, qlen, 256, 1)
    indices[3 * qlen, 0] = 2000                                    # request 3's first row lists the NaN key
    indices = indices.cuda()
    cfg = shard.cfg
    seq_lens = problem.seq_lens.clone()

    def step():
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=torch.bfloat16,
                                  kv_dtype=shard.kv_cache.dtype)
        return mla_dcp.verify_sparse(cfg, view, problem.q, shard.kv_cache, indices, problem.kv_scale)

    got = step()
    cpu = [t.cpu() for t in (problem.q, shard.kv_cache, shard.block_table, indices, seq_lens)]
    scale = None if problem.kv_scale is None else problem.kv_scale.cpu()
    view = mla_dcp.build_view(cfg, cpu[4], cpu[2])
    want = mla_dcp.verify_sparse(cfg, view, cpu[0], cpu[1], cpu[3], scale)
    exact = mla_dcp.verify_sparse(cfg, view, cpu[0].float(), cpu[1].float() if kv is None else cpu[1], cpu[3], scale)
    budget = error_budget(exact[0], want[0], torch.bfloat16)
    assert_close_special("out", got[0], exact[0], budget)
    # Over DeepSeek's layout the kernel rounds each dequantized key to q's bf16 for its products,
    # which the pure path (float32 keys) does not: up to four times q's own rounding in the LSE.
    lse_budget = max(1e-3, error_budget(exact[1], want[1], torch.float32)) * (4 if kv == "ds" else 1)
    assert_close_special("lse", got[1], exact[1], lse_budget)
    assert got[1][3 * qlen].isnan().all()

    def update(seed, new_lens):
        def run():
            seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
            indices.copy_(random_indices(new_lens, qlen, 256, seed)[0])
        return run

    check_graph_follows(step, [update(2, [0, 5, 690, 2999, 4, 2049]), update(3, lens)])


@pytest.mark.gpu
def test_a_gpu_sparse_row_has_its_bits_alone_in_invariant_mode_and_not_by_default():
    """On the GPU the split of a row's slots follows the batch by default (64 requests: one piece a
    row; one request alone: 32), so a row's bits move with the batch; batch-invariant mode fixes the
    split and the merge's layout: the row's bits are those of its request verified alone."""
    from mla_dcp.ops import launchers

    batch, qlen, topk = 64, 2, 512
    lens = [1000 + 37 * b for b in range(batch)]
    problem = make_problem(lens, qlen=qlen, world=1, interleave=1, block_size=64, max_model_len=4096,
                           dtype=torch.bfloat16, num_heads=16, kv_lora_rank=512, rope_dim=64, seed=5, device="cuda")
    shard = problem.shards[0]
    indices = random_indices(lens, qlen, topk, 5)[0].cuda()
    request, rows = 7, slice(7 * qlen, 8 * qlen)
    pieces = {n: launchers.sparse_pieces(n * qlen, 16, topk, 1, False, problem.q.device) for n in (batch, 1)}
    assert pieces[batch] != pieces[1], pieces
    for invariant in (False, True):
        cfg = dataclasses.replace(shard.cfg, batch_invariant=invariant)
        whole = mla_dcp.verify_sparse(cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table),
                                      problem.q, shard.kv_cache, indices)
        alone_view = mla_dcp.build_view(cfg, problem.seq_lens[request:request + 1],
                                        shard.block_table[request:request + 1])
        alone = mla_dcp.verify_sparse(cfg, alone_view, problem.q[rows], shard.kv_cache, indices[rows])
        same = torch.equal(whole[0][rows], alone[0]) and torch.equal(whole[1][rows], alone[1])
        assert same == invariant, invariant


def test_a_sparse_step_exports_and_runs_as_a_package_at_any_batch(tmp_path):
    """torch.export and AOTInductor with the batch dynamic: the package's results and cache equal
    eager's bit for bit at other batch sizes, lengths and selections."""
    from mla_dcp.testing import EngineStep, check_exported_package

    cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=2, block_size=16, max_model_len=128, dcp_world_size=2,
                               dcp_rank=1, interleave=2, kv_lora_rank=32, rope_dim=16, softmax_scale=0.2)
    gen = torch.Generator().manual_seed(11)

    def inputs(batch):
        seq_lens = torch.randint(3, 100, (batch,), dtype=torch.int32, generator=gen)
        return (seq_lens,
                torch.randperm(40, generator=gen)[:batch * cfg.min_table_blocks].view(batch, -1).to(torch.int32),
                random_indices(seq_lens.tolist(), cfg.qlen, 12, int(torch.randint(0, 99, (1,), generator=gen)))[0],
                torch.randn(batch * cfg.qlen, 4, 48, generator=gen), torch.randn(batch * cfg.qlen, 48, generator=gen),
                torch.randn(40, 16, 48, generator=gen))

    batch = torch.export.Dim("batch", min=2, max=12)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "select": {0: cfg.qlen * batch},
               "q": {0: cfg.qlen * batch}, "latents": {0: cfg.qlen * batch}, "kv_cache": None}
    exported, written = check_exported_package(EngineStep(cfg, "sparse"), inputs, dynamic,
                                               str(tmp_path / "sparse_step.pt2"))
    assert "mla_dcp.sparse_attention.default" in [str(n.target) for n in exported.graph.nodes]
    assert sum(written) > 0, written


def ds_problem(world, interleave, qlen=2, seed=0):
    """make_problem's shards with each cache re-encoded in DeepSeek's fp8 layout (uint8 rows), and
    the global keys as the layout reads them back (NaN slots stay NaN: a tile of NaN)."""
    from mla_dcp import _fp8_ds_mla

    problem = make_problem(LENS, qlen=qlen, world=world, interleave=interleave, block_size=16, max_model_len=160,
                           seed=seed, num_heads=4, kv_lora_rank=128, rope_dim=16)
    for shard in problem.shards:
        rows = shard.kv_cache.reshape(-1, shard.kv_cache.shape[-1])
        shard.kv_cache = _fp8_ds_mla.encode(rows, 128).view(*shard.kv_cache.shape[:2], -1)
    flat = problem.global_kv.reshape(-1, problem.global_kv.shape[-1])
    problem.global_kv = _fp8_ds_mla.decode(_fp8_ds_mla.encode(flat, 128), 128, 16).view(problem.global_kv.shape)
    return problem


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 2), (3, 1)])
def test_the_ds_fp8_layout_matches_the_reference_over_its_values(world, interleave):
    """Caches in DeepSeek's fp8 layout (e4m3 latent with a scale per 128 values, bf16 rope), per rank
    and merged, against the global reference over the values the layout holds."""
    problem = ds_problem(world, interleave, seed=world)
    assert problem.shards[0].kv_cache.dtype == torch.uint8 and problem.shards[0].kv_cache.shape[-1] == 132 + 32
    indices, mask = random_indices(LENS, 2, 24, world)
    partials = sparse_step(problem, indices)
    for rank, (out, lse) in enumerate(partials):
        assert_close_special(f"rank {rank} out", out, reference_of(problem, mask, rank)[0], 1e-4)
    out, lse = merge_partials(partials)
    want_out, want_lse = reference_of(problem, mask)
    assert_close_special("out", out, want_out, 1e-4)
    assert_close_special("lse", lse, want_lse, 1e-4)


def test_write_cache_fills_the_ds_layout_that_verify_sparse_reads():
    """A step's tokens written through cache_slots + write_cache into an empty uint8 cache give the
    bytes the layout's encoder gives, where the step's rows land, and nothing elsewhere."""
    from mla_dcp import _fp8_ds_mla

    cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=3, block_size=8, max_model_len=64, dcp_world_size=2, dcp_rank=1,
                               kv_lora_rank=128, rope_dim=16, softmax_scale=0.2)
    width = mla_dcp.fp8_ds_mla_width(128, 16)
    cache = torch.zeros(10, 8, width, dtype=torch.uint8)
    table = torch.arange(cfg.min_table_blocks * 2, dtype=torch.int32).view(2, -1)
    seq_lens = torch.tensor([9, 20], dtype=torch.int32)
    latent = torch.randn(6, 144)
    slots = mla_dcp.cache_slots(cfg, seq_lens, table)
    mla_dcp.write_cache(cache, slots, latent)
    flat = cache.view(-1, width)
    held = slots >= 0
    assert held.any() and (~held).any()
    assert torch.equal(flat[slots[held]], _fp8_ds_mla.encode(latent[held], 128))
    written = torch.zeros(flat.shape[0], dtype=torch.bool)
    written[slots[held]] = True
    assert flat[~written].eq(0).all()


@pytest.mark.parametrize("call,error,message", [
    (lambda c, k, q, v, i: mla_dcp.verify_sparse(c, v, q, k[..., :-1], i), ValueError,
     r"kv_cache must have shape \[num_blocks, 16, 164\], got \[.*163\]"),
    (lambda c, k, q, v, i: mla_dcp.verify_sparse(c, v, q, k, i, torch.ones(1)), ValueError,
     "kv_scale must be None for a cache in DeepSeek's fp8 layout"),
    (lambda c, k, q, v, i: mla_dcp.verify(c, v, q, k), TypeError,
     r"kv_cache of dtype torch.uint8 \(DeepSeek's fp8 layout for sparse MLA\) is read by mla_dcp.verify_sparse only"),
    (lambda c, k, q, v, i: mla_dcp.write_cache(k, torch.zeros(2, dtype=torch.long), torch.zeros(2, 150)), ValueError,
     r"kv_cache of dtype torch.uint8 holds DeepSeek's fp8 layout .*got rows of 164"),
])
def test_a_ds_layout_cache_is_checked_by_name(call, error, message):
    problem = ds_problem(1, 1)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    with pytest.raises(error, match=message):
        call(shard.cfg, shard.kv_cache, problem.q, view, random_indices(LENS, 2, 8, 0)[0])
