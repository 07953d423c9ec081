"""Eager step plans: a repeated `verify` layout launches from its plan.

The first eager call of a layout takes the full path (validation, choices,
launchers) under a recording; later calls whose key matches allocate their
outputs and repeat the recorded launches (fast_launch.Sequence). `build_view`
has no plan of its own (its launch replays from the launcher's). A key too
coarse would launch another layout's kernel, grid or integers: where fast
launch paths corrupt memory. So each case makes a plan, then calls with one
fact changed, and asserts the call took the full path again and returns what
the full path returns; same-layout calls must replay, bit for bit.

On the CPU the launchers run under Triton's interpreter, with the "plain
eager CUDA" test patched to accept CPU tensors (the GPU tests run the real
thing: tests/test_gpu.py).
"""

import dataclasses
import types

import pytest
import torch

import mla_dcp
from mla_dcp import api, bench
from mla_dcp.testing import assert_close_special, error_budget, make_problem

pytestmark = pytest.mark.interpret


@pytest.fixture
def launchers(monkeypatch):
    from mla_dcp.ops import launchers as module
    from mla_dcp.ops import library
    monkeypatch.setattr(library, "plain_eager_cuda", lambda tensor: isinstance(tensor, torch.Tensor))
    full = []
    for name in ("merged_attention",):
        real = getattr(module, name)
        monkeypatch.setitem(library._LAUNCHERS, name,
                            (lambda real, name: lambda *a: (full.append(name), real(*a))[1])(real, name))
    return types.SimpleNamespace(module=module, full=full)


def _problem(block_size=16, dtype=torch.float16, kv_dtype=None, lens=(0, 2, 37, 70), heads=4):
    return make_problem(list(lens), qlen=2, num_heads=heads, kv_lora_rank=32, rope_dim=16, world=2, interleave=2,
                        block_size=block_size, max_model_len=80, dtype=dtype, kv_dtype=kv_dtype or dtype,
                        num_segments=2, seed=3)


def _step(cfg, seq_lens, table, q, kv, scale=None):
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    return view, mla_dcp.verify(cfg, view, q, kv, scale)


def _assert_bitwise(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(torch.nan_to_num(g), torch.nan_to_num(w))


def _forget_plans():
    for plans in api._eager_plans()[0]._PLANS:
        plans.clear()


def _full_path(cfg, *inputs):
    """The same call with every plan forgotten."""
    _forget_plans()
    return _step(cfg, *inputs)


@pytest.mark.parametrize("block_size", [16, 24])   # blocks are pages (a slice) / expanded by a launch
def test_a_repeated_layout_replays_bit_for_bit(launchers, block_size):
    problem = _problem(block_size)
    shard = problem.shards[1]
    cfg = shard.cfg
    inputs = (problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    first_view, first = _step(cfg, *inputs)
    made = list(launchers.full)
    assert made.count("merged_attention") == 1
    # Another step of the same layout: new lengths and new queries; verify calls no launcher.
    seq_lens = problem.seq_lens.clone()
    seq_lens[1:] -= 1
    q = problem.q.clone().mul_(0.5)
    view, got = _step(cfg, seq_lens, shard.block_table, q, shard.kv_cache)
    assert launchers.full.count("merged_attention") == 1
    assert (view.page_table._base is shard.block_table) == (block_size == 16)
    want_view, want = _full_path(cfg, seq_lens, shard.block_table, q, shard.kv_cache)
    assert launchers.full.count("merged_attention") == 2
    for g, w in zip(view[:4], want_view[:4]):
        assert torch.equal(g, w)
    _assert_bitwise(got, want)
    # And it is this step's answer, not the first one's (the oracle, in float64).
    static = dict(qlen=cfg.qlen, world=cfg.dcp_world_size, rank=cfg.dcp_rank, interleave=cfg.interleave,
                  max_local_len=cfg.max_local_len, kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale)
    exact = mla_dcp.pure.verify(q.double(), shard.kv_cache.double(), seq_lens, shard.block_table, **static)
    low = mla_dcp.pure.verify(q, shard.kv_cache, seq_lens, shard.block_table, **static)
    for name, g, e, lo in zip(("out", "lse"), got, exact, low):
        assert_close_special(name, g, e, error_budget(e, lo, q.dtype))
    assert not torch.equal(got[1].nan_to_num(), first[1].nan_to_num())


def _changed(problem, shard, change):
    """(cfg, seq_lens, table, q, kv, scale) of the problem with one fact changed."""
    cfg, seq_lens, table, q, kv = shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache
    scale = None
    if change == "dtype":
        q, kv = q.float(), kv.float()
    elif change == "q strided":
        q = torch.cat([q, q], dim=-1)[..., :q.shape[-1]]
    elif change == "q misaligned":
        flat = torch.empty(q.numel() + 1, dtype=q.dtype)[1:]
        q = flat.view(q.shape).copy_(q)
    elif change == "cache blocks":
        kv = torch.cat([kv, kv])
    elif change == "cache misaligned":
        flat = torch.empty(kv.numel() + 1, dtype=kv.dtype)[1:]
        kv = flat.view(kv.shape).copy_(kv)
    elif change == "batch":
        seq_lens, table, q = seq_lens[:3], table[:3], q[:3 * cfg.qlen]
    elif change == "table strided":
        table = torch.cat([table, table], dim=1)[:, ::2]
    elif change == "equal config, another object":
        cfg = dataclasses.replace(cfg)
    elif change == "other config":
        cfg = dataclasses.replace(cfg, num_segments=3)
    elif change == "fp8 cache":
        kv, scale = kv.to(torch.float8_e4m3fn), torch.tensor([1.0])
    return cfg, seq_lens, table, q, kv, scale


@pytest.mark.parametrize("change", ["dtype", "q strided", "q misaligned", "cache blocks", "cache misaligned",
                                    "batch", "table strided", "equal config, another object", "other config",
                                    "fp8 cache"])
def test_another_layout_takes_the_full_path(launchers, change):
    problem = _problem()
    shard = problem.shards[0]
    _step(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    _step(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    assert launchers.full.count("merged_attention") == 1
    cfg, seq_lens, table, q, kv, scale = _changed(problem, shard, change)
    del launchers.full[:]
    view, got = _step(cfg, seq_lens, table, q, kv, scale)
    # A strided block table is expanded into a page table of the first one's layout: verify's inputs
    # then have the same layout, and its plan serves.
    assert launchers.full.count("merged_attention") == (change != "table strided")
    want_view, want = _full_path(cfg, seq_lens, table, q, kv, scale)
    for g, w in zip(view[:4], want_view[:4]):
        assert torch.equal(g, w)
    _assert_bitwise(got, want)


def test_errors_still_name_the_argument_after_a_plan(launchers):
    problem = _problem()
    shard = problem.shards[0]
    view, _ = _step(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    _step(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    with pytest.raises(ValueError, match="q must have shape"):
        mla_dcp.verify(shard.cfg, view, problem.q[:-1], shard.kv_cache)
    with pytest.raises(TypeError, match="kv_cache"):
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache.int())
    with pytest.raises(ValueError, match="block_table"):
        mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table[:, :1])


def test_a_value_check_a_hook_or_a_recording_takes_the_full_path(launchers, monkeypatch):
    from mla_dcp.ops import fast_launch
    problem = _problem()
    shard = problem.shards[0]
    inputs = (problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    _step(shard.cfg, *inputs)
    _step(shard.cfg, *inputs)
    assert launchers.full.count("merged_attention") == 1
    monkeypatch.setenv("MLA_DCP_CHECK", "1")
    _step(shard.cfg, *inputs)
    assert launchers.full.count("merged_attention") == 2
    monkeypatch.delenv("MLA_DCP_CHECK")
    with fast_launch.recording() as records:
        _step(shard.cfg, *inputs)
    assert launchers.full.count("merged_attention") == 3 and records
    monkeypatch.setattr(fast_launch, "_hooked", lambda: True)
    _step(shard.cfg, *inputs)
    assert launchers.full.count("merged_attention") == 4


# The merged-attention launcher's own plan, which serves every caller (the op in a compiled graph
# too): the same keys, checked on the launcher itself.

@pytest.fixture
def merged(launchers, monkeypatch):
    """launchers.merged_attention with its full path counted, its plans forgotten."""
    module = launchers.module
    module._MERGED_PLANS.clear()
    real, full = module._merged_attention, []
    monkeypatch.setattr(module, "_merged_attention", lambda *a: (full.append(1), real(*a))[1])
    cfg_facts = api._facts

    def call(cfg, seq_lens, table, q, kv, scale=None):
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        facts = cfg_facts(cfg)
        return module.merged_attention(q, kv, scale, view.row_lens, view.page_table, view.work, view.segments,
                                       cfg.qlen, cfg.kv_lora_rank, facts.scale, facts.schedule_chunk,
                                       cfg.fp8_products)
    return types.SimpleNamespace(call=call, full=full, module=module)


def test_the_launcher_replays_its_plan_bit_for_bit(merged):
    problem = _problem()
    shard = problem.shards[1]
    first = merged.call(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    assert merged.full == [1]
    seq_lens = problem.seq_lens.clone()
    seq_lens[1:] -= 1
    q = problem.q.clone().mul_(0.5)
    got = merged.call(shard.cfg, seq_lens, shard.block_table, q, shard.kv_cache)
    assert merged.full == [1], "the second call took the full path"
    merged.module._MERGED_PLANS.clear()
    want = merged.call(shard.cfg, seq_lens, shard.block_table, q, shard.kv_cache)
    assert merged.full == [1, 1]
    _assert_bitwise(got, want)
    assert not torch.equal(got[1].nan_to_num(), first[1].nan_to_num())


@pytest.mark.parametrize("change", ["dtype", "q strided", "q misaligned", "cache blocks", "cache misaligned",
                                    "batch", "other config", "fp8 cache"])
def test_the_launcher_takes_its_full_path_for_another_layout(merged, change):
    problem = _problem()
    shard = problem.shards[0]
    for _ in range(2):
        merged.call(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    assert merged.full == [1]
    inputs = _changed(problem, shard, change)
    got = merged.call(*inputs)
    assert merged.full == [1, 1]
    merged.module._MERGED_PLANS.clear()
    _assert_bitwise(got, merged.call(*inputs))


def test_the_launcher_plans_nothing_under_a_forced_plan_and_records_inside_a_recording(merged):
    from mla_dcp.ops import fast_launch, tiles
    problem = _problem()
    shard = problem.shards[0]
    inputs = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache)
    merged.call(*inputs)
    merged.call(*inputs)
    assert merged.full == [1]
    with fast_launch.recording() as records:
        merged.call(*inputs)
    assert merged.full == [1, 1] and records      # an enclosing recording sees every launch
    with tiles.forced_plan(tiles.attention_plan(8, 32, torch.float16, torch.float16, 16, problem.q.device)):
        merged.call(*inputs)
        merged.call(*inputs)
    assert merged.full == [1, 1, 1, 1]


# Token trees and sparse rows: verify with a MaskedView, and verify_sparse, each one plan of the
# whole call (a tree's context partial is its scratch, consumed by the block launch).

@pytest.fixture
def routes(launchers, monkeypatch):
    """Each call of the masked and sparse routes' full paths, by name."""
    full = []
    for name in ("_masked_anew", "_sparse_anew"):
        real = getattr(api, name)
        monkeypatch.setattr(api, name, (lambda real, name: lambda *a: (full.append(name), real(*a))[1])(real, name))
    return full


def _tree(cfg, seq_lens, table, q, kv, mask):
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype, block_mask=mask)
    return mla_dcp.verify(cfg, view, q, kv)


def _indices(seq_lens, qlen, topk=24, seed=0):
    """Each row's listed positions (the benchmark's: distinct, inside its causal window, -1 after)."""
    return bench.listed_positions(seq_lens, qlen, topk, 1, 1, 0, seed)[0]


def test_a_repeated_tree_step_replays_one_plan_bit_for_bit(routes):
    problem = _problem()
    shard = problem.shards[1]
    cfg, table, kv = shard.cfg, shard.block_table, shard.kv_cache
    mask = mla_dcp.tree_mask([-1, -1])     # two roots: each row sees the context and itself
    first = _tree(cfg, problem.seq_lens, table, problem.q, kv, mask)
    assert routes == ["_masked_anew"]
    seq_lens = problem.seq_lens.clone()
    seq_lens[1:] -= 1
    q = problem.q.clone().mul_(0.5)
    got = _tree(cfg, seq_lens, table, q, kv, mask)
    assert routes == ["_masked_anew"], "the second tree step took the full path"
    _forget_plans()
    want = _tree(cfg, seq_lens, table, q, kv, mask)
    assert routes == ["_masked_anew"] * 2
    _assert_bitwise(got, want)
    assert not torch.equal(got[1].nan_to_num(), first[1].nan_to_num())
    # The plan's answer is the tree's, not the causal step's (row 0 of a request sees itself only:
    # the causal row 0 sees the same; row 1 sees key 1 but not key 0 of its block).
    causal = _step(cfg, seq_lens, table, q, kv)[1]
    assert not torch.equal(got[1].nan_to_num(), causal[1].nan_to_num())


@pytest.mark.parametrize("change", ["mask per request", "batch", "dtype", "another config object"])
def test_another_tree_layout_takes_the_full_path(routes, change):
    problem = _problem()
    shard = problem.shards[0]
    cfg, seq_lens, table, q, kv = shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache
    mask = mla_dcp.tree_mask([-1, 0])
    for _ in range(2):
        _tree(cfg, seq_lens, table, q, kv, mask)
    assert routes == ["_masked_anew"]
    if change == "mask per request":
        mask = torch.stack([mla_dcp.tree_mask([-1, b % 2 - 1]) for b in range(seq_lens.shape[0])])
    elif change == "batch":
        seq_lens, table, q = seq_lens[:3], table[:3], q[:3 * cfg.qlen]
    elif change == "dtype":
        q, kv = q.float(), kv.float()
    else:
        cfg = dataclasses.replace(cfg)
    got = _tree(cfg, seq_lens, table, q, kv, mask)
    assert routes == ["_masked_anew"] * 2
    _forget_plans()
    _assert_bitwise(got, _tree(cfg, seq_lens, table, q, kv, mask))


def test_a_tree_view_of_another_config_is_refused_after_a_plan(routes):
    problem = _problem()
    shard = problem.shards[0]
    mask = mla_dcp.tree_mask([-1, 0])
    for _ in range(2):
        _tree(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, mask)
    other = dataclasses.replace(shard.cfg, num_segments=3)
    view = mla_dcp.build_view(other, problem.seq_lens, shard.block_table, q_dtype=problem.q.dtype, block_mask=mask)
    with pytest.raises(ValueError, match="another cfg"):
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache)


def test_a_repeated_sparse_call_replays_one_plan_bit_for_bit(routes):
    problem = _problem()
    shard = problem.shards[1]
    cfg, table, kv = shard.cfg, shard.block_table, shard.kv_cache

    def sparse(seq_lens, q, indices):
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype)
        return mla_dcp.verify_sparse(cfg, view, q, kv, indices)

    first = sparse(problem.seq_lens, problem.q, _indices(problem.seq_lens, cfg.qlen))
    assert routes == ["_sparse_anew"]
    seq_lens = problem.seq_lens.clone()
    seq_lens[1:] -= 1
    q, indices = problem.q.clone().mul_(0.5), _indices(seq_lens, cfg.qlen, seed=1)
    got = sparse(seq_lens, q, indices)
    assert routes == ["_sparse_anew"], "the second sparse call took the full path"
    _forget_plans()
    want = sparse(seq_lens, q, indices)
    assert routes == ["_sparse_anew"] * 2
    _assert_bitwise(got, want)
    assert not torch.equal(got[1].nan_to_num(), first[1].nan_to_num())
    # Another top-k is another layout: the full path, and its own answer.
    wider = _indices(seq_lens, cfg.qlen, topk=40, seed=1)
    got = sparse(seq_lens, q, wider)
    assert routes == ["_sparse_anew"] * 3
    _forget_plans()
    _assert_bitwise(got, sparse(seq_lens, q, wider))
    # Errors still name the argument once a plan exists.
    with pytest.raises(ValueError, match="indices must have shape"):
        sparse(seq_lens, q, wider[:-1])
