"""The launchers' plans (a repeated call replays its launch) and the C-launcher path of fast_launch.

A replay rebuilds a launch's arguments from the call's inputs and takes
every other argument from the plan. A plan key too coarse would launch with
another call's integers, tile or kernel: where fast launch paths corrupt
memory. So each case below calls a launcher once (making its plan), then
again with one fact changed, and asserts that what it launched is what the
full path launches for that call (kernel, grid, options and every argument),
and that same-layout calls replay rather than choose again.
"""

import dataclasses
import math
import sys

import pytest
import torch

from mla_dcp import pure
from mla_dcp.testing import make_problem

pytestmark = pytest.mark.interpret


@pytest.fixture(scope="module")
def launchers():
    from mla_dcp.ops import launchers as module
    return module


@pytest.fixture(scope="module")
def fast_launch():
    from mla_dcp.ops import fast_launch as module
    return module


def _position(t, results) -> int | None:
    results = results if isinstance(results, tuple) else (results,)
    return next((k for k, r in enumerate(results) if r is t), None)


def _same_argument(a, b, got, want) -> bool:
    """Inputs the same object; a call's own outputs the same one of its results; the rest equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        k = _position(a, got)
        return a is b if k is None else k == _position(b, want)
    if hasattr(a, "block_shape"):
        fields = lambda d: {k: v for k, v in vars(d).items() if k != "base"}
        return type(a) is type(b) and a.base is b.base and fields(a) == fields(b)
    return type(a) is type(b) and a == b


def _assert_same_launch(replayed, full, got, want):
    assert len(replayed) == len(full) == 1
    (gk, gg, ga, go), (wk, wg, wa, wo) = replayed[0], full[0]
    assert gk is wk and tuple(gg) == tuple(wg) and go == wo
    assert len(ga) == len(wa)
    for i, (a, b) in enumerate(zip(ga, wa)):
        assert _same_argument(a, b, got, want), (i, a, b)


def _replayed_and_full(fast_launch, call, same_launch=True):
    """Asserts that ``call`` with the plans as they are launches what it launches on the full path
    (``same_launch``); returns both launches and both results."""
    with fast_launch.recording() as replayed:
        got = call()
    for plans in fast_launch._PLANS:
        plans.clear()
    with fast_launch.recording() as full:
        want = call()
    if same_launch:
        _assert_same_launch(replayed, full, got, want)
    return replayed, full, got, want


def _problem(dtype=torch.float16, heads=4, qlen=2, block_size=16):
    return make_problem([0, 2, 37, 70], qlen=qlen, num_heads=heads, kv_lora_rank=32, rope_dim=16, world=2,
                        interleave=2, block_size=block_size, max_model_len=80, dtype=dtype, kv_dtype=dtype,
                        num_segments=2, seed=5)


def _attention_call(launchers, problem, shard, view, q=None, kv=None, scale=None, finalize=False):
    q = problem.q if q is None else q
    kv = shard.kv_cache if kv is None else kv
    cfg = shard.cfg
    op = launchers.single_segment_attention if finalize else launchers.segmented_attention
    return lambda: op(q, kv, None, view.row_lens, view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank,
                      cfg.scale if scale is None else scale)


def _views(problem, shard, **changes):
    import mla_dcp
    cfg = dataclasses.replace(shard.cfg, **changes)
    return cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)


@pytest.mark.parametrize("change", ["nothing", "scale", "q elsewhere", "q strided", "q misaligned", "q dtype",
                                    "cache blocks", "cache misaligned", "segments", "finalize"])
def test_an_attention_replay_launches_what_the_full_path_launches(launchers, fast_launch, monkeypatch, change):
    from mla_dcp.ops import tiles
    # The descriptor kernel where the layout allows (as on Hopper): then an address's alignment picks the kernel.
    plan = tiles.AttentionPlan(block_m=16, block_n=16, num_warps=4, num_stages=1, tma=True)
    monkeypatch.setattr(launchers, "attention_plan", lambda *args: plan)
    problem = _problem()
    shard = problem.shards[1]
    _, view = _views(problem, shard)
    first = _attention_call(launchers, problem, shard, view)
    first()                                               # makes the plan
    q, kv, scale, finalize = problem.q, shard.kv_cache, None, False
    if change == "scale":
        scale = shard.cfg.scale * 0.5
    elif change == "q elsewhere":
        q = problem.q.clone()
    elif change == "q strided":
        q = torch.cat([problem.q, problem.q], dim=-1)[..., :problem.q.shape[-1]]
    elif change == "q misaligned":
        q = torch.empty(problem.q.numel() + 1, dtype=problem.q.dtype)[1:].view(problem.q.shape)
        q.copy_(problem.q)
    elif change == "q dtype":
        q = problem.q.float()
    elif change == "cache blocks":
        kv = torch.cat([shard.kv_cache, shard.kv_cache])
    elif change == "cache misaligned":
        flat = torch.empty(shard.kv_cache.numel() + 1, dtype=shard.kv_cache.dtype)[1:]
        kv = flat.view(shard.kv_cache.shape)
        kv.copy_(shard.kv_cache)
    elif change == "segments":
        _, view = _views(problem, shard, num_segments=3)
    elif change == "finalize":
        _, view = _views(problem, shard, num_segments=1)
        finalize = True
    replayed, full, got, want = _replayed_and_full(
        fast_launch, _attention_call(launchers, problem, shard, view, q, kv, scale, finalize))
    if not finalize:
        # seg_out is unspecified (never stored) for a row with no key in its segment.
        assert torch.equal(got[2], want[2])
        keyless = (want[2] == 0)[..., None]
        got, want = (torch.where(keyless, 0.0, got[0]), *got[1:]), (torch.where(keyless, 0.0, want[0]), *want[1:])
    for g, w in zip(got, want):
        assert torch.equal(torch.nan_to_num(g), torch.nan_to_num(w)) and torch.equal(g.isnan(), w.isnan())


def test_same_layout_calls_replay_and_other_layouts_choose_again(launchers, fast_launch, monkeypatch):
    chosen = []
    anew = launchers._launch_attention_anew
    monkeypatch.setattr(launchers, "_launch_attention_anew", lambda *a: (chosen.append(a[0].dtype), anew(*a))[1])
    problem = _problem()
    shard = problem.shards[0]
    _, view = _views(problem, shard)
    for q in (problem.q, problem.q.clone(), problem.q.clone()):
        _attention_call(launchers, problem, shard, view, q)()
    assert chosen == [torch.float16]
    _attention_call(launchers, problem, shard, view, problem.q.float())()
    assert chosen == [torch.float16, torch.float32]


@pytest.mark.parametrize("change", ["nothing", "lengths", "batch", "rank", "schedule"])
def test_a_metadata_replay_launches_what_the_full_path_launches(launchers, fast_launch, change):
    seq_lens = torch.tensor([5, 0, 130, 61], dtype=torch.int32)
    args = dict(qlen=3, world=2, rank=1, interleave=2, causal=True, page=16, max_pages=8, num_items=12, chunk=0,
                programs=0)
    launchers.step_metadata(seq_lens, *args.values())
    if change == "lengths":
        seq_lens = torch.tensor([7, 9, 3, 100], dtype=torch.int32)
    elif change == "batch":
        seq_lens, args["num_items"] = torch.tensor([5, 0, 130], dtype=torch.int32), 9
    elif change == "rank":
        args["rank"] = 0
    elif change == "schedule":
        args["num_items"], args["programs"] = 16, 12
    replayed, full, got, want = _replayed_and_full(fast_launch, lambda: launchers.step_metadata(seq_lens,
                                                                                                *args.values()))
    lens = pure.verify_row_lens(seq_lens, 3, 2, args["rank"], 2)
    schedule = pure.build_schedule(lens, 3, 16, 8, args["num_items"], 0, args["programs"])
    for g, w, oracle in zip(got, want, (lens, *schedule)):
        assert torch.equal(g, w) and torch.equal(g, oracle)


@pytest.mark.parametrize("change", ["nothing", "items", "strided partials", "dtype"])
def test_a_merge_replay_launches_what_the_full_path_launches(launchers, fast_launch, change):
    gen = torch.Generator().manual_seed(3)
    seg_out = torch.randn(6, 2, 3, 32, generator=gen)
    seg_max, seg_sum = torch.randn(6, 2, 3, generator=gen), torch.rand(6, 2, 3, generator=gen) + 0.5
    segments = torch.tensor([[0, 2, -1], [2, 3, 5]], dtype=torch.int32)
    launchers.merge_segments(seg_out, seg_max, seg_sum, segments, torch.float16)
    out_dtype = torch.float16
    if change == "items":
        seg_out, seg_max, seg_sum = seg_out[:5].clone(), seg_max[:5].clone(), seg_sum[:5].clone()
        segments = torch.tensor([[0, 2, -1], [2, 2, 4]], dtype=torch.int32)
    elif change == "strided partials":
        seg_out = torch.cat([seg_out, seg_out], dim=-1)[..., :32]
    elif change == "dtype":
        out_dtype = torch.float32
    strided = change == "strided partials"
    replayed, full, got, want = _replayed_and_full(
        fast_launch, lambda: launchers.merge_segments(seg_out, seg_max, seg_sum, segments, out_dtype),
        same_launch=not strided)
    if strided:      # the launcher copies them: a plan without a replay, the full path each time
        assert len(replayed) == 1 and replayed[0][2][0] is not seg_out
        assert list(launchers._MERGE_PLANS.values()) == [None]
    oracle = pure.merge_segments(seg_out, seg_max, seg_sum, segments, out_dtype)
    for g, w, o in zip(got, want, oracle):
        assert torch.equal(g, w)
        torch.testing.assert_close(g, o, rtol=2e-3, atol=2e-3)


def test_merge_ranks_and_page_expansion_replay(launchers, fast_launch):
    gen = torch.Generator().manual_seed(4)
    outs, lses = torch.randn(3, 5, 2, 16, generator=gen), torch.randn(3, 5, 2, generator=gen)
    launchers.merge_ranks(outs, lses)
    outs2 = torch.randn(3, 5, 2, 16, generator=gen)
    replayed, full, got, want = _replayed_and_full(fast_launch, lambda: launchers.merge_ranks(outs2, lses))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    table = torch.tensor([[3, 1, 7], [0, 2, 1]], dtype=torch.int32)
    launchers.expand_pages(table, 96, 200)
    table2 = torch.tensor([[4, 5, 6], [9, 8, 1]], dtype=torch.int32)
    replayed, full, got, want = _replayed_and_full(fast_launch, lambda: launchers.expand_pages(table2, 96, 200))
    assert torch.equal(got, pure.expand_page_table(table2, 96, 200)) and torch.equal(got, want)


def test_a_plan_for_a_forced_tile_is_not_kept(launchers):
    from mla_dcp.ops import tiles
    problem = _problem()
    shard = problem.shards[0]
    _, view = _views(problem, shard)
    with tiles.forced_plan(tiles.AttentionPlan(block_m=16, block_n=16, num_warps=4, num_stages=1)):
        _attention_call(launchers, problem, shard, view)()
    assert not launchers._ATTENTION_PLANS


# ---- the C launcher below the compiled kernel's launcher (Triton 3.6's driver layout), with fakes ----

_BASE_ARGS_FORMAT = "iiiKKppOOOOOO"     # what fast_launch checks the launcher's module for
ENCODED = []


def make_tensordesc_arg(arg, metadata):  # the driver's encoder, as the closure's globals name it
    ENCODED.append((arg.base.data_ptr(), metadata))
    return [("map", arg.base.data_ptr(), metadata), *arg.shape, *arg.strides]


def _closure(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        return launcher, tensordesc_indices, tensordesc_meta
    return inner


class _CLauncher:
    """Stands for the C launcher (a callable without Python code)."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, *args):
        self.calls.append(args)


class FakeRun:
    """A compiled kernel's launcher with Triton 3.6's attributes; its C launcher records its arguments."""

    def __init__(self, descriptors=(), scratch=0):
        self.c_calls, self.run_calls = [], []
        c_launch = _CLauncher(self.c_calls)
        self.launch = _closure(c_launch, set(descriptors), [{"swizzle": 128}] * len(descriptors)) \
            if descriptors else c_launch
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, *args):
        self.run_calls.append(args)


def test_the_c_launcher_gets_each_descriptor_encoded_once_per_address(fast_launch):
    from triton.tools.tensor_descriptor import TensorDescriptor
    ENCODED.clear()
    run = FakeRun(descriptors=(1,))
    raw, coop, pdl, descriptors = fast_launch._raw_launcher(run, 3)
    assert raw is not None and (coop, pdl) == (False, True) and [d[0] for d in descriptors] == [1]
    entry = object.__new__(fast_launch._Entry)
    entry.run, entry.function, entry.metadata, entry.tail, entry.compiled = run, "fn", "md", (7,), None
    entry.raw, entry.coop, entry.pdl, entry.descriptors, entry.encoded = raw, coop, pdl, descriptors, {}
    x = torch.zeros(8)
    a, b = torch.zeros(64, 32, dtype=torch.float16), torch.zeros(64, 32, dtype=torch.float16)
    for base in (a, a, b):
        entry((2,), 5, (x, TensorDescriptor(base, [64, 32], [32, 1], [16, 32]), 3))
    assert [ptr for ptr, _ in ENCODED] == [a.data_ptr(), b.data_ptr()]        # a's kept, b's encoded anew
    assert run.run_calls == [] and len(run.c_calls) == 3
    call = run.c_calls[2]
    assert call[:13] == (2, 1, 1, 5, "fn", False, True, None, None, "md", None, None, None)
    assert call[13] is x and call[14] == ("map", b.data_ptr(), {"swizzle": 128})
    assert call[15:] == (64, 32, 32, 1, 3, 7)


def test_other_layouts_call_the_compiled_kernels_launcher(fast_launch, monkeypatch):
    assert fast_launch._raw_launcher(FakeRun(scratch=64), 3)[0] is None            # needs scratch memory
    assert fast_launch._raw_launcher(FakeRun(descriptors=(5,)), 3)[0] is None     # a descriptor past the args
    assert isinstance(fast_launch._raw_launcher(FakeRun(), 3)[0], _CLauncher)
    closure = FakeRun()
    closure.launch = lambda *args: None                                           # a Python wrapper of its own
    assert fast_launch._raw_launcher(closure, 3)[0] is None
    monkeypatch.setattr(sys.modules[__name__], "_BASE_ARGS_FORMAT", "iiiKKOOOO")   # another driver's layout
    assert fast_launch._raw_launcher(FakeRun(), 3)[0] is None
    assert fast_launch._raw_launcher(object(), 3)[0] is None


def test_with_the_fast_path_off_no_plan_is_kept(launchers, fast_launch, monkeypatch):
    monkeypatch.setattr(fast_launch, "enabled", False)
    seq_lens = torch.tensor([5, 0, 130], dtype=torch.int32)
    for _ in range(2):
        launchers.step_metadata(seq_lens, 2, 1, 0, 1, True, 16, 9, 6)
    assert not launchers._METADATA_PLANS
