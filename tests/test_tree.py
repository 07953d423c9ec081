"""Masked verify blocks (token trees): build_view(..., block_mask=...) and mla_dcp.tree_mask."""

import dataclasses

import pytest
import torch

import mla_dcp
from mla_dcp.testing import (EngineStep, assert_close_special, check_compiled_follows, check_exported_package,
                             check_problem, make_problem, merge_partials, platform_fp8, poison_key)

SMALL = dict(num_heads=4, kv_lora_rank=16, rope_dim=8)
LENS = [0, 1, 2, 7, 40, 130]


def ancestors_by_loop(parents):
    """The mask by walking each node's chain in Python (shares no code with tree_mask)."""
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    context = [p == mla_dcp.TREE_CONTEXT for p in parents]
    for t in range(n):
        for j in range(n):
            if context[t]:
                mask[t][j] = j <= t
            elif context[j]:
                mask[t][j] = True
        node = t
        while not context[t] and node >= 0:
            mask[t][node] = True
            node = parents[node]
    return mask


def random_tree(n, g, context=0):
    """``context`` TREE_CONTEXT entries, then a random tree of n - context nodes in topological order."""
    parents = [mla_dcp.TREE_CONTEXT] * context
    for i in range(context, n):
        choice = int(torch.randint(-1, i - context, (1,), generator=g))
        parents.append(-1 if choice < 0 else context + choice)
    return parents


def test_tree_mask_equals_a_loop_over_random_trees():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 9, (1,), generator=g))
        parents = random_tree(n, g, int(torch.randint(0, n, (1,), generator=g)))
        got = mla_dcp.tree_mask(parents, check=True)
        assert got.dtype == torch.bool and got.tolist() == ancestors_by_loop(parents), parents
    # A batch of trees: each its own.
    trees = [random_tree(5, g, c) for c in (0, 2, 4)]
    batch = mla_dcp.tree_mask(torch.tensor(trees, dtype=torch.int32))
    assert batch.tolist() == [ancestors_by_loop(t) for t in trees]


def test_a_chain_is_the_causal_mask_and_one_root_level_sees_only_itself():
    assert torch.equal(mla_dcp.tree_mask([-1, 0, 1, 2, 3]), torch.ones(5, 5, dtype=torch.bool).tril())
    assert torch.equal(mla_dcp.tree_mask([-1, -1, -1]), torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("parents,entry", [
    ([-1, 1], "parents[1] = 1"),                 # not before it
    ([-1, 0, 5], "parents[2] = 5"),
    ([-1, -3], "parents[1] = -3"),
    ([-1, -2, 0], "parents[1] = -2"),           # a context entry after a node
    ([-2, 0, -1], "parents[1] = 0"),            # a node whose parent is a context entry
])
def test_tree_mask_names_a_bad_parent_when_asked(parents, entry):
    with pytest.raises(ValueError, match=entry.replace("[", r"\[").replace("]", r"\]")):
        mla_dcp.tree_mask(parents, check=True)


def test_tree_mask_refuses_a_bad_layout():
    with pytest.raises(TypeError, match="parents must have dtype torch.int32 or torch.int64, got torch.float32"):
        mla_dcp.tree_mask(torch.zeros(3))
    with pytest.raises(ValueError, match=r"parents must have shape \[n\] or \[B, n\] with n >= 1.*got \[1, 2, 3\]"):
        mla_dcp.tree_mask(torch.zeros(1, 2, 3, dtype=torch.long))


def trees_for(batch, qlen, seed):
    """One random tree per request, some shorter than the block (context entries in front)."""
    g = torch.Generator().manual_seed(seed)
    return mla_dcp.tree_mask(torch.tensor(
        [random_tree(qlen, g, int(torch.randint(0, qlen, (1,), generator=g)) if b % 2 else 0) for b in range(batch)]))


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (2, 4), (3, 2), (8, 1), (8, 3)])
@pytest.mark.parametrize("qlen", [1, 2, 3, 5, 8])
def test_trees_match_the_global_reference(world, interleave, qlen):
    """Per rank and merged, against attention in global coordinates with the tree's mask (the
    context whole, the block by the mask), on caches with NaN in every slot a rank must not read."""
    mask = trees_for(len(LENS), qlen, world * 10 + qlen)
    problem = make_problem(LENS, qlen=qlen, world=world, interleave=interleave, block_size=16, max_model_len=160,
                           seed=world * 10 + qlen, block_mask=mask, **SMALL)
    check_problem(problem, torch.float32, None)


def test_one_mask_for_every_request_and_16_bit_and_fp8_caches():
    mask = mla_dcp.tree_mask([-1, 0, 0, 1, 1, 2])
    for dtype, kv_dtype in ((torch.float32, None), (torch.bfloat16, None), (torch.float16, platform_fp8())):
        problem = make_problem(LENS, qlen=6, world=3, interleave=2, block_size=16, max_model_len=160, dtype=dtype,
                               kv_dtype=kv_dtype, block_mask=mask, seed=5, **SMALL)
        check_problem(problem, dtype, kv_dtype)


def test_the_causal_path_fails_the_tree_test():
    """Negative control: a tree sent down the causal path reads its siblings' keys and comes back
    silently wrong; the comparison must catch it (and the masked path passes it)."""
    mask = mla_dcp.tree_mask([-1, 0, 0, 1])
    problem = make_problem(LENS, qlen=4, world=2, interleave=2, block_size=16, max_model_len=160, block_mask=mask,
                           **SMALL)
    want_out, _ = problem.reference()
    causal = [mla_dcp.verify(s.cfg, mla_dcp.build_view(s.cfg, problem.seq_lens, s.block_table), problem.q, s.kv_cache)
              for s in problem.shards]
    with pytest.raises(AssertionError):
        assert_close_special("out", merge_partials(causal)[0], want_out, 1e-4)
    check_problem(problem, torch.float32, None)


def test_a_chain_mask_gives_the_causal_answer():
    problem = make_problem(LENS, qlen=5, world=3, interleave=1, block_size=16, max_model_len=160, **SMALL)
    chain = mla_dcp.tree_mask([-1, 0, 1, 2, 3])
    for shard in problem.shards:
        plain = mla_dcp.verify(shard.cfg, mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table),
                               problem.q, shard.kv_cache)
        masked = mla_dcp.verify(shard.cfg, mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table,
                                                              block_mask=chain), problem.q, shard.kv_cache)
        for name, got, want in zip(("out", "lse"), masked, plain):
            assert_close_special(name, got, want, 1e-5)


def test_nan_in_a_block_key_poisons_exactly_the_rows_that_see_it():
    """Node 1's key NaN: rows 1 and 3 (it and its child) NaN, rows 0 and 2 (root, sibling) finite;
    a request past max_model_len NaN in every row."""
    mask = mla_dcp.tree_mask([-1, 0, 0, 1])
    problem = make_problem([40, 50, 9], qlen=4, world=2, interleave=1, block_size=16, max_model_len=60,
                           block_mask=mask, **SMALL)
    poison_key(problem, 1, 50 - 4 + 1, slice(0, 3), float("nan"))
    check_problem(problem, torch.float32, None)
    out, lse = merge_partials([mla_dcp.verify(s.cfg, mla_dcp.build_view(s.cfg, problem.seq_lens, s.block_table,
                                                                         block_mask=mask), problem.q, s.kv_cache)
                               for s in problem.shards])
    rows = out[4:8].isnan().flatten(1).all(1).tolist()
    assert rows == [False, True, False, True] and lse[4:8].isnan().all(1).tolist() == rows
    too_long = problem.seq_lens.clone()
    too_long[2] = 61                    # past max_model_len: the host cannot see it without a sync
    partials = [mla_dcp.verify(s.cfg, mla_dcp.build_view(s.cfg, too_long, s.block_table, block_mask=mask),
                               problem.q, s.kv_cache) for s in problem.shards]
    out, lse = merge_partials(partials)
    assert out[8:].isnan().all() and lse[8:].isnan().all() and not out[:4].isnan().any()


def test_ragged_trees_through_ragged_blocks():
    """Requests with trees of 0-4 nodes packed as an engine sends them: each tree on the last rows of
    its block behind TREE_CONTEXT entries; each token against its request's global reference."""
    qlen, counts, lens = 4, [3, 0, 4, 1], [30, 17, 64, 9]
    g = torch.Generator().manual_seed(1)
    parents = torch.tensor([[mla_dcp.TREE_CONTEXT] * (qlen - n) + [p + qlen - n if p >= 0 else p
                                                                   for p in random_tree(n, g)]
                            for n in counts])
    mask = mla_dcp.tree_mask(parents, check=True)
    problem = make_problem(lens, qlen=qlen, world=2, interleave=2, block_size=16, max_model_len=80, block_mask=mask,
                           seed=2, **SMALL)
    want_out, want_lse = problem.reference()
    tokens = torch.cat([problem.q[b * qlen + qlen - n:(b + 1) * qlen] for b, n in enumerate(counts)])
    starts = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist())
    blocks = mla_dcp.ragged_blocks(starts, qlen, tokens.shape[0])
    partials = [mla_dcp.verify(s.cfg, mla_dcp.build_view(s.cfg, problem.seq_lens, s.block_table, block_mask=mask),
                               blocks.rows(tokens), s.kv_cache) for s in problem.shards]
    out, lse = blocks.tokens(*merge_partials(partials))
    rows = torch.cat([torch.arange(b * qlen + qlen - n, (b + 1) * qlen) for b, n in enumerate(counts)])
    assert_close_special("out", out, want_out[rows], 1e-4)
    assert_close_special("lse", lse, want_lse[rows], 1e-4)


def test_invariant_mode_a_tree_row_has_the_bits_of_its_request_verified_alone(many_threads):
    qlen = 4
    mask = trees_for(len(LENS), qlen, 3)
    problem = make_problem(LENS, qlen=qlen, world=2, interleave=1, block_size=16, max_model_len=160, seed=4,
                           **SMALL)
    for shard in problem.shards:
        cfg = dataclasses.replace(shard.cfg, batch_invariant=True, invariant_segment_tokens=128)
        out, lse = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table,
                                                          block_mask=mask), problem.q, shard.kv_cache)
        for b in range(len(LENS)):
            rows = slice(b * qlen, (b + 1) * qlen)
            view = mla_dcp.build_view(cfg, problem.seq_lens[b:b + 1], shard.block_table[b:b + 1],
                                      block_mask=mask[b:b + 1])
            alone = mla_dcp.verify(cfg, view, problem.q[rows], shard.kv_cache)
            assert torch.equal(out[rows], alone[0]) and torch.equal(lse[rows], alone[1]), b


def test_a_compiled_tree_step_keeps_one_graph_while_lengths_and_trees_change():
    problem = make_problem(LENS, qlen=4, world=2, interleave=1, block_size=16, max_model_len=160, seed=6, **SMALL)
    shard = problem.shards[1]
    cfg = shard.cfg

    def step(q, seq_lens, mask):
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, block_mask=mask)
        return mla_dcp.verify(cfg, view, q, shard.kv_cache)

    check_compiled_follows(step, [(problem.q, (problem.seq_lens + shift).clamp(0, 160).to(torch.int32),
                                   trees_for(len(LENS), 4, seed)) for seed, shift in ((0, 0), (1, -1), (2, -7))])


def test_accepting_a_path_rewrites_it_where_the_next_step_reads_it():
    """The engine's loop after a tree step: the accepted path's latents written again at the
    positions that follow the context (cache_slots and write_cache, each rank its own), then a
    causal step over them equals attention over the accepted sequence in global order."""
    world, interleave, heads, width = 2, 2, 4, 24
    g = torch.Generator().manual_seed(7)
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=4, block_size=8, max_model_len=64, dcp_world_size=world,
                               interleave=interleave, kv_lora_rank=16, rope_dim=8, softmax_scale=0.3)
    context, parents, accepted = 21, [-1, 0, 0, 1], [0, 1, 3]           # root, its first child, that one's child
    latents = torch.randn(context + 4, width, generator=g)              # the context, then the tree's nodes
    table = torch.arange(cfg.min_table_blocks, dtype=torch.int32)[None]
    caches = [torch.full((cfg.min_table_blocks, 8, width), float("nan")) for _ in range(world)]
    ranks = [dataclasses.replace(cfg, dcp_rank=r) for r in range(world)]

    def write(first, rows):            # rows at global positions first.. of every rank's cache
        for rank_cfg, cache in zip(ranks, caches):
            fill = dataclasses.replace(rank_cfg, qlen=rows.shape[0])
            mla_dcp.write_cache(cache, mla_dcp.cache_slots(fill, torch.tensor([first + rows.shape[0]],
                                                                                dtype=torch.int32), table), rows)

    def step(rank_cfgs, seq_len, q, mask=None):
        seq = torch.tensor([seq_len], dtype=torch.int32)
        return merge_partials([mla_dcp.verify(c, mla_dcp.build_view(c, seq, table, block_mask=mask), q, cache)
                               for c, cache in zip(rank_cfgs, caches)])

    write(0, latents)
    mask = mla_dcp.tree_mask(parents)
    q = torch.randn(4, heads, width, generator=g)
    out, lse = step(ranks, context + 4, q, mask)
    want = mla_dcp.pure.reference_attention(q, latents[None], torch.tensor([context + 4]), qlen=4, kv_lora_rank=16,
                                            softmax_scale=0.3, block_mask=mask)
    assert_close_special("tree out", out, want[0], 1e-5)
    # Accept the path; write it again right after the context, then verify two new tokens causally.
    path = latents[[context + i for i in accepted]]
    write(context, path)
    fresh = torch.randn(2, width, generator=g)
    write(context + len(accepted), fresh)
    sequence = torch.cat([latents[:context], path, fresh])
    q2 = torch.randn(2, heads, width, generator=g)
    causal = [dataclasses.replace(c, qlen=2) for c in ranks]
    out, lse = step(causal, sequence.shape[0], q2)
    want_out, want_lse = mla_dcp.pure.reference_attention(q2, sequence[None], torch.tensor([sequence.shape[0]]),
                                                          qlen=2, kv_lora_rank=16, softmax_scale=0.3)
    assert_close_special("next out", out, want_out, 1e-5)
    assert_close_special("next lse", lse, want_lse, 1e-5)


def test_the_block_op_passes_opcheck():
    from mla_dcp.ops import library as ops

    problem = make_problem([0, 5, 40], qlen=3, world=2, interleave=1, block_size=16, max_model_len=48, **SMALL)
    shard = problem.shards[0]
    out, lse = torch.randn(9, 4, 16), torch.randn(9, 4)
    lse[0] = float("-inf")
    mask = mla_dcp.tree_mask([-1, 0, 0]).expand(3, 3, 3)
    # NaN-free inputs: opcheck compares with equality, which NaN fails (the NaN rule is the tests' above).
    cache = torch.nan_to_num(shard.kv_cache)
    torch.library.opcheck(ops.block_attention, (problem.q, cache, None, out, lse, shard.block_table, mask,
                                                problem.seq_lens, 3, 2, 0, 1, 48, 16, 0.3, False))


@pytest.mark.parametrize("mask,error,message", [
    (lambda m: m.float(), TypeError, "block_mask must have dtype torch.bool, got torch.float32"),
    (lambda m: m[:3], ValueError, r"block_mask must have shape \[qlen, qlen\] = \[4, 4\] .*or \[B, qlen, qlen\] = "
                                  r"\[6, 4, 4\], got \[3, 4\]"),
    (lambda m: m.expand(2, 4, 4), ValueError, r"block_mask must have shape .*got \[2, 4, 4\]"),
    (lambda m: m.to("meta"), ValueError, "block_mask must be on the same device as seq_lens"),
    (lambda m: [[True] * 4] * 4, TypeError, "block_mask must be a torch.Tensor, got list"),
])
def test_a_bad_mask_is_named_before_any_work(mask, error, message):
    problem = make_problem(LENS, qlen=4, **SMALL)
    shard = problem.shards[0]
    with pytest.raises(error, match=message):
        mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table,
                           block_mask=mask(mla_dcp.tree_mask([-1, 0, 0, 1])))


def test_a_masked_view_of_another_config_is_refused():
    problem = make_problem(LENS, qlen=4, world=2, **SMALL)
    mask = mla_dcp.tree_mask([-1, 0, 0, 1])
    view = mla_dcp.build_view(problem.shards[0].cfg, problem.seq_lens, problem.shards[0].block_table,
                              block_mask=mask)
    with pytest.raises(ValueError, match="view was built by build_view for another cfg than verify's .*dcp_rank=0 vs 1"):
        mla_dcp.verify(problem.shards[1].cfg, view, problem.q, problem.shards[1].kv_cache)


def _tree_ranks_check(rank, world):
    from mla_dcp import distributed

    mask = trees_for(len(LENS), 4, 8)
    problem = make_problem(LENS, qlen=4, world=world, interleave=2, block_size=16, max_model_len=160, ranks=[rank],
                           seed=8, block_mask=mask, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table, block_mask=mask)
    want_out, want_lse = problem.reference()
    heads = slice(rank * SMALL["num_heads"] // world, (rank + 1) * SMALL["num_heads"] // world)
    for method in distributed.METHODS:
        out, lse = distributed.verify(shard.cfg, view, problem.q, shard.kv_cache, method=method)
        whole = method == "all_reduce"
        assert_close_special(f"{method} out", out, want_out if whole else want_out[:, heads], 1e-4)
        assert_close_special(f"{method} lse", lse, want_lse if whole else want_lse[:, heads], 1e-4)


def test_trees_through_each_merge_over_real_ranks():
    """Each rank a process (gloo): its masked view, each collective merge, against the global reference."""
    from mla_dcp.testing import launch_group

    launch_group(_tree_ranks_check, 2, backend="gloo")


def test_the_module_examples_run():
    import doctest

    import mla_dcp.pure.tree
    import mla_dcp.tree

    assert doctest.testmod(mla_dcp.tree).failed == 0 and doctest.testmod(mla_dcp.pure.tree).failed == 0


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv", [(16, None), (128, None), (16, "fp8"), (128, "fp8")])
def test_a_gpu_tree_step_matches_the_pure_one_and_replays_in_a_graph(heads, kv):
    """Every attention path (the seesaw at 128 heads, the narrow kernel at 16; bf16 and e4m3 caches)
    and the block kernel against the pure path within the data's budget, NaN in the same places; no
    host sync; one CUDA graph replayed with other lengths and other trees equals the eager step."""
    from mla_dcp.testing import check_graph_follows, error_budget

    kv_dtype = platform_fp8() if kv else None
    lens, qlen = [0, 9, 700, 3000, 130, 2049], 4
    mask = trees_for(len(lens), qlen, 1).cuda()
    problem = make_problem(lens, qlen=qlen, world=2, interleave=1, block_size=64, max_model_len=4096,
                           dtype=torch.bfloat16, kv_dtype=kv_dtype, num_heads=heads, kv_lora_rank=512, rope_dim=64,
                           seed=heads, device="cuda", block_mask=mask)
    shard = problem.shards[poison_key(problem, 3, 3000 - qlen + 1, slice(0, 4), float("nan"))]
    cfg = shard.cfg
    seq_lens = problem.seq_lens.clone()

    def step():
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=torch.bfloat16,
                                  kv_dtype=shard.kv_cache.dtype, block_mask=mask)
        return mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)

    got = step()
    cpu = [t.cpu() for t in (problem.q, shard.kv_cache, shard.block_table, mask, seq_lens)]
    cpu_scale = None if problem.kv_scale is None else problem.kv_scale.cpu()
    want = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, cpu[4], cpu[2], block_mask=cpu[3]), cpu[0], cpu[1], cpu_scale)
    exact = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, cpu[4], cpu[2], block_mask=cpu[3]), cpu[0].float(),
                           cpu[1].float() if kv is None else cpu[1], cpu_scale)
    budget = error_budget(exact[0], want[0], torch.bfloat16)
    assert_close_special("out", got[0], exact[0], budget)
    assert_close_special("lse", got[1], exact[1], max(1e-3, error_budget(exact[1], want[1], torch.float32)))
    assert got[0].isnan().any()                    # the poisoned key's rows

    def update(seed, new_lens):
        return lambda: (seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32)),
                        mask.copy_(trees_for(len(lens), qlen, seed)))

    check_graph_follows(step, [update(2, [0, 5, 690, 2999, 4, 2049]), update(3, lens)])


def test_a_tree_step_exports_and_runs_as_a_package_at_any_batch(tmp_path):
    """torch.export and AOTInductor of a tree step (cache write, masked view, verify) with the batch
    dynamic: the package's results and cache equal eager's bit for bit at other batch sizes, trees
    and lengths."""
    cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=4, block_size=16, max_model_len=128, dcp_world_size=2,
                               dcp_rank=1, interleave=2, kv_lora_rank=32, rope_dim=16, softmax_scale=0.2)
    gen = torch.Generator().manual_seed(9)

    def inputs(batch):
        return (torch.randint(3, 100, (batch,), dtype=torch.int32, generator=gen),
                torch.randperm(40, generator=gen)[:batch * cfg.min_table_blocks].view(batch, -1).to(torch.int32),
                trees_for(batch, cfg.qlen, int(torch.randint(0, 99, (1,), generator=gen))),
                torch.randn(batch * cfg.qlen, 4, 48, generator=gen), torch.randn(batch * cfg.qlen, 48, generator=gen),
                torch.randn(40, 16, 48, generator=gen))

    batch = torch.export.Dim("batch", min=2, max=12)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "select": {0: batch}, "q": {0: cfg.qlen * batch},
               "latents": {0: cfg.qlen * batch}, "kv_cache": None}
    exported, written = check_exported_package(EngineStep(cfg, "tree"), inputs, dynamic,
                                               str(tmp_path / "tree_step.pt2"))
    assert "mla_dcp.block_attention.default" in [str(n.target) for n in exported.graph.nodes]
    assert sum(written) > 0, written
