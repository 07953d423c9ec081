"""Custom ops: opcheck, one compiled graph for the whole step, no recompiles."""

import dataclasses

import pytest
import torch
from unittest import mock

import mla_dcp
from mla_dcp import pure
from mla_dcp.ops import library as ops
from mla_dcp.testing import EngineStep, check_exported_package, make_problem

TestCase = pytest.importorskip("expecttest").TestCase   # a test dependency the GPU machines lack

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def problem_on(device, dtype=torch.float32, kv_dtype=None):
    return make_problem([0, 3, 40, 90], qlen=3, num_heads=4, kv_lora_rank=32, rope_dim=16, world=2,
                        interleave=2, block_size=16, max_model_len=128, dtype=dtype, kv_dtype=kv_dtype,
                        seed=5, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_opcheck_every_op(device, kv):
    dtype = torch.float16 if kv == "fp8" or device == "cuda" else torch.float32
    problem = problem_on(device, dtype, torch.float8_e4m3fn if kv == "fp8" else None)
    shard = problem.shards[1]
    cfg = shard.cfg
    row_lens = ops.row_lens(problem.seq_lens, cfg.qlen, 2, 1, 2)
    pages = ops.expand_pages(shard.block_table, cfg.block_size, cfg.max_local_len)
    batch = problem.seq_lens.shape[0]
    work, segments = ops.schedule(row_lens, cfg.qlen, cfg.page_size, cfg.max_pages, 3 * batch)
    single, _ = ops.schedule(row_lens, cfg.qlen, cfg.page_size, cfg.max_pages, batch)
    seg = ops.segmented_attention(problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work, cfg.qlen,
                                  cfg.kv_lora_rank, cfg.scale)
    out, lse = ops.merge_segments(*seg, segments, dtype)
    checks = [
        (ops.row_lens, (problem.seq_lens, cfg.qlen, 2, 1, 2)),
        (ops.expand_pages, (shard.block_table, cfg.block_size, cfg.max_local_len)),
        (ops.schedule, (row_lens, cfg.qlen, cfg.page_size, cfg.max_pages, 3 * batch)),
        (ops.step_metadata, (problem.seq_lens, cfg.qlen, 2, 1, 2, True, cfg.page_size, cfg.max_pages, 3 * batch)),
        (ops.step_metadata_auto, (problem.seq_lens, cfg.qlen, 2, 1, 2, True, cfg.page_size, cfg.max_pages, 0,
                                  cfg.num_heads, cfg.kv_lora_rank, dtype, shard.kv_cache.dtype, -1)),
        (ops.segmented_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work, cfg.qlen,
                                   cfg.kv_lora_rank, cfg.scale)),
        (ops.merge_segments, (*seg, segments, dtype)),
        (ops.single_segment_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, single,
                                        cfg.qlen, cfg.kv_lora_rank, cfg.scale)),
        (ops.merged_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work, segments,
                                cfg.qlen, cfg.kv_lora_rank, cfg.scale)),
        (ops.merged_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, single,
                                ops.schedule(row_lens, cfg.qlen, cfg.page_size, cfg.max_pages, batch)[1],
                                cfg.qlen, cfg.kv_lora_rank, cfg.scale)),
        (ops.merge_ranks, (torch.stack([out, out]), torch.stack([lse, lse - 1]))),
        (ops.ragged_map, (torch.tensor([1, 2, 5, 5, 9], dtype=torch.int32, device=device), 3, 11)),
    ]
    attention_ops = (ops.segmented_attention, ops.single_segment_attention, ops.merged_attention)
    if kv == "fp8":   # the fp8-products mode of the attention ops
        checks += [(op, args + (0, True)) for op, args in checks if op in attention_ops]
    for op, args in checks:
        # Unwritten (empty-segment) seg_out entries are unspecified: opcheck
        # compares whole outputs, so feed it a defined tensor.
        args = tuple(torch.nan_to_num(a) if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                     and a.dim() == 4 else a for a in args)
        utils = ("test_faketensor", "test_aot_dispatch_static")
        # test_schema compares inputs with float ops that fp8 lacks on the CPU.
        if kv == "same" or op not in attention_ops:
            utils = ("test_schema",) + utils
        torch.library.opcheck(op, args, test_utils=utils)


def step(cfg, seq_lens, block_table, q, kv_cache, kv_scale):
    view = mla_dcp.build_view(cfg, seq_lens, block_table)
    return mla_dcp.verify(cfg, view, q, kv_cache, kv_scale)


def compiled_capturing(fn, **options):
    """``torch.compile(fn, fullgraph=True)`` that keeps each traced graph."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return torch.compile(fn, backend=capture, fullgraph=True, **options), graphs


def _sizes_unfixed(graph_module) -> list[str]:
    """The metadata op's outputs (row_lens, work, segments) whose sizes a traced graph leaves open:
    neither constants nor expressions of its inputs' sizes."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    (meta,) = [n for n in graph_module.graph.nodes if "step_metadata" in str(n.target)]
    values = meta.meta["example_value"]
    return [name for name, value in zip(("row_lens", "work", "segments"), values) if free_unbacked_symbols(value)]


def call_targets(graph_module) -> list[str]:
    return [str(n.target) for n in graph_module.graph.nodes if n.op == "call_function"]


class CompiledStep(TestCase):
    def test_one_graph_metadata_and_attention_nodes_no_recompile(self):
        """Two nodes a step: the metadata, then stages 3 and 4 in one op (each
        custom op costs a dispatch per call in a compiled graph)."""
        torch._dynamo.reset()
        problem = problem_on("cpu")
        shard = problem.shards[0]
        shard = dataclasses.replace(shard, cfg=dataclasses.replace(shard.cfg, num_segments=2))
        compiled, graphs = compiled_capturing(step, dynamic=False)
        got = compiled(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        want = step(shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        self.assertExpectedInline("\n".join(call_targets(graphs[0])), """\
<built-in function getitem>
mla_dcp.step_metadata.default
<built-in function getitem>
<built-in function getitem>
<built-in function getitem>
mla_dcp.merged_attention.default
<built-in function getitem>
<built-in function getitem>""")

        # Same shapes, other lengths: no new graph, and the right answer.
        new_lens = torch.tensor([0, 1, 17, 85], dtype=torch.int32)  # within the allocated blocks
        got = compiled(shard.cfg, new_lens, shard.block_table, problem.q, shard.kv_cache, None)
        want = step(shard.cfg, new_lens, shard.block_table, problem.q, shard.kv_cache, None)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        self.assertEqual(len(graphs), 1)

    def test_an_eager_call_elsewhere_recompiles_nothing(self):
        """A compiled step stays valid when an eager call serves (the first one
        sets the API's eager plans up): a step compiled before any eager call
        and called again after one takes the same graph (build_view read that
        state before asking whether it was compiling, and dynamo guarded on it)."""
        from mla_dcp import api

        torch._dynamo.reset()
        problem = problem_on("cpu")
        shard = problem.shards[0]
        args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        saved = api._EAGER
        try:
            api._EAGER = None            # as in a process whose first call is compiled
            compiled, graphs = compiled_capturing(step, dynamic=False)
            compiled(*args)
            api._eager_plans()           # what an eager call that a launcher serves does first
            got = compiled(*args)
        finally:
            api._EAGER = saved
        torch.testing.assert_close(got, step(*args), rtol=0, atol=0)
        self.assertEqual(len(graphs), 1)

    def test_a_new_environment_variable_recompiles_nothing(self):
        """The compiled step does not guard on the process environment: a variable
        set after compiling (by a library's lazy set-up, say) takes the same
        graph. The value-check request (MLA_DCP_CHECK) was read before asking
        whether the call is compiling, and dynamo guarded on the environment
        dict's size."""
        import os

        torch._dynamo.reset()
        problem = problem_on("cpu")
        shard = problem.shards[0]
        args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        compiled, graphs = compiled_capturing(step, dynamic=False)
        compiled(*args)
        name = "MLA_DCP_TEST_SET_AFTER_COMPILING"
        assert name not in os.environ
        os.environ[name] = "1"
        try:
            got = compiled(*args)
        finally:
            del os.environ[name]
        torch.testing.assert_close(got, step(*args), rtol=0, atol=0)
        self.assertEqual(len(graphs), 1)

    def test_a_changing_batch_size_compiles_once_more_then_follows_it(self):
        """Engines send every batch size: the second size takes torch.compile's
        dynamic-shape graph (one recompile), and later sizes reuse it, equal
        to eager bit for bit; a batch of one gets its own graph (the
        framework specialises sizes 0 and 1)."""
        torch._dynamo.reset()
        cfg = problem_on("cpu").shards[1].cfg
        compiled, graphs = compiled_capturing(step)
        gen = torch.Generator().manual_seed(3)
        for batch in (2, 3, 5, 4, 1, 6):
            seq_lens, table, q, kv = _inputs(cfg, batch, gen)
            got = compiled(cfg, seq_lens, table, q, kv, None)
            want = step(cfg, seq_lens, table, q, kv, None)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            self.assertEqual(len(graphs), 1 if batch == 2 else 3 if batch in (1, 6) else 2)

    def test_a_schedule_shape_that_follows_the_batch_keeps_one_graph(self):
        """A GPU's schedule shape follows the batch at nearly every size (see
        the next test). The compiled step must not: one graph for every batch
        size past the first two (and the size-1 one the framework
        specialises), where a graph computing the shape would be traced again
        at each size until torch.compile's recompile limit fails it. Each
        size's answer equals eager's bit for bit, so both took that size's
        shape (emulated here on the CPU: work rows and the stream's columns
        change with the batch)."""
        from mla_dcp.ops import library
        real = library.schedule_shape_of
        seen = []

        def jumpy(batch, device, q_dtype, kv_dtype, max_pages, page, m_size, kv_lora_rank, stream,
                  fixed_segments=None):
            if fixed_segments is not None:
                return real(batch, device, q_dtype, kv_dtype, max_pages, page, m_size, kv_lora_rank, stream,
                            fixed_segments)
            segments = 1 + (7 * batch) % 5
            seen.append((batch, segments))
            return (batch * segments + batch, batch * segments) if batch % 2 else (batch * segments, 0)

        torch._dynamo.reset()
        cfg = problem_on("cpu").shards[1].cfg
        compiled, graphs = compiled_capturing(step)
        gen = torch.Generator().manual_seed(5)
        sizes = (2, 3, 5, 4, 6, 7, 8, 9, 10, 11, 12, 1, 13)
        with mock.patch.object(library, "schedule_shape_of", jumpy):
            for batch in sizes:
                seq_lens, table, q, kv = _inputs(cfg, batch, gen)
                got = compiled(cfg, seq_lens, table, q, kv, None)
                want = step(cfg, seq_lens, table, q, kv, None)
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        self.assertEqual(len(graphs), 3)
        # The first size's graph and size 1's fix every size, as CUDA graph trees need (they refuse a
        # graph holding a size it does not fix); the dynamic graph leaves the work table's to the run.
        self.assertEqual([_sizes_unfixed(g) for g in graphs], [[], ["work"], []])
        # Both paths asked for each size's shape, and the shapes differed.
        self.assertEqual({b for b, _ in seen}, set(sizes))
        self.assertGreater(len({s for _, s in seen}), 3)

    def test_inductor_fullgraph_equals_eager(self):
        torch._dynamo.reset()
        problem = problem_on("cpu", torch.float16, torch.float8_e4m3fn)
        shard = problem.shards[1]
        args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, problem.kv_scale)
        got = torch.compile(step, fullgraph=True)(*args)
        want = step(*args)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


class _Step(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    def forward(self, seq_lens, block_table, q, kv_cache):
        return step(self.cfg, seq_lens, block_table, q, kv_cache, None)


def _inputs(cfg, batch, gen):
    return (torch.randint(0, 120, (batch,), dtype=torch.int32, generator=gen),
            torch.randint(0, 40, (batch, cfg.min_table_blocks), dtype=torch.int32, generator=gen),
            torch.randn(batch * cfg.qlen, cfg.num_heads, 48, generator=gen), torch.randn(40, cfg.block_size, 48,
                                                                                         generator=gen))


def test_torch_export_keeps_the_step_as_its_ops_and_takes_any_batch():
    """torch.export (AOT deployment): the step's two custom ops and nothing
    else (the metadata op chooses the schedule's shape when it runs, so a
    program exported on one device schedules for the one it runs on), equal
    to eager bit for bit on other lengths, and with the batch a dynamic
    dimension on other batch sizes too."""
    cfg = problem_on("cpu").shards[1].cfg
    gen = torch.Generator().manual_seed(4)
    module = _Step(cfg)
    exported = torch.export.export(module, _inputs(cfg, 3, gen))
    ops_called = [str(n.target) for n in exported.graph.nodes if n.op == "call_function" and "mla_dcp" in str(n.target)]
    assert ops_called == ["mla_dcp.step_metadata_auto.default", "mla_dcp.merged_attention.default"]
    args = _inputs(cfg, 3, gen)
    for got, want in zip(exported.module()(*args), module(*args)):
        assert torch.equal(got, want)
    batch = torch.export.Dim("batch", min=2, max=64)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "q": {0: cfg.qlen * batch}, "kv_cache": None}
    exported = torch.export.export(module, _inputs(cfg, 3, gen), dynamic_shapes=dynamic)
    for size in (2, 5, 9):
        args = _inputs(cfg, size, gen)
        for got, want in zip(exported.module()(*args), module(*args)):
            assert torch.equal(got, want), f"batch {size}"


@pytest.mark.parametrize("fact,value", [("qlen", 0), ("max_pages", 0), ("page", -1), ("num_heads", 0),
                                        ("kv_lora_rank", 0), ("stream", 2)])
def test_the_run_time_metadata_op_names_a_static_fact_out_of_range(fact, value):
    """mla_dcp::step_metadata_auto is a public op: a fact out of range is an error naming it, when it
    runs and when traced (its fake), never a schedule of the wrong shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    args = dict(seq_lens=torch.tensor([5, 9], dtype=torch.int32), qlen=2, world=1, rank=0, interleave=1,
                causal=True, page=16, max_pages=8, chunk=0, num_heads=4, kv_lora_rank=32, q_dtype=torch.float32,
                kv_dtype=torch.float32, stream=-1)
    ops.step_metadata_auto(**args)     # in range: runs
    args[fact] = value
    with pytest.raises(RuntimeError, match=f"{fact} must be"):
        ops.step_metadata_auto(**args)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match=f"{fact} must be"):
        ops.step_metadata_auto(**dict(args, seq_lens=mode.from_tensor(args["seq_lens"])))


def test_aot_inductor_package_runs_the_step_at_any_batch(tmp_path):
    """AOT deployment without Python: the exported step compiled by AOTInductor into a package,
    loaded back and run at other batch sizes (the metadata op's work table sized when it runs),
    equal to eager bit for bit."""
    cfg = problem_on("cpu").shards[1].cfg
    gen = torch.Generator().manual_seed(6)
    module = _Step(cfg)
    batch = torch.export.Dim("batch", min=2, max=64)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "q": {0: cfg.qlen * batch}, "kv_cache": None}
    exported = torch.export.export(module, _inputs(cfg, 3, gen), dynamic_shapes=dynamic)
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "step.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    for size in (2, 5, 9):
        args = _inputs(cfg, size, gen)
        got, want = runner(*args), module(*args)
        assert len(got) == 2 and all(torch.equal(g, w) for g, w in zip(got, want)), f"batch {size}"


def test_an_engine_step_exports_and_runs_as_a_package_at_any_batch(tmp_path):
    """torch.export and AOTInductor of a step that writes its tokens to the cache (an input the
    program mutates) and verifies a ragged block, with the batch dynamic: the package's results
    and cache equal eager's bit for bit at other batch sizes and counts. (A traced token count
    is a SymInt: ragged_blocks refused it before it took one.)"""
    cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=3, block_size=16, max_model_len=128, dcp_world_size=2,
                               dcp_rank=1, interleave=2, kv_lora_rank=32, rope_dim=16, softmax_scale=0.2)
    gen = torch.Generator().manual_seed(7)

    def inputs(batch):
        counts = torch.randint(0, cfg.qlen + 1, (batch,), generator=gen)
        return (torch.randint(3, 100, (batch,), dtype=torch.int32, generator=gen),
                torch.randperm(40, generator=gen)[:batch * cfg.min_table_blocks].view(batch, -1).to(torch.int32),
                torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32),
                torch.randn(batch * cfg.qlen, 4, 48, generator=gen), torch.randn(batch * cfg.qlen, 48, generator=gen),
                torch.randn(40, 16, 48, generator=gen))

    batch = torch.export.Dim("batch", min=2, max=12)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "select": {0: batch + 1},
               "q": {0: cfg.qlen * batch}, "latents": {0: cfg.qlen * batch}, "kv_cache": None}
    exported, written = check_exported_package(EngineStep(cfg, "ragged"), inputs, dynamic,
                                               str(tmp_path / "engine_step.pt2"))
    assert [str(n.target) for n in exported.graph.nodes if "mla_dcp" in str(n.target)] == [
        "mla_dcp.write_cache.default", "mla_dcp.step_metadata_auto.default", "mla_dcp.merged_attention.default"]
    assert sum(written) > 0, written          # the package wrote (this rank's share of) the tokens


@pytest.mark.parametrize("block_size,expands", [(16, False), (96, True), (256, True)])
def test_page_table_is_a_view_when_blocks_are_pages(block_size, expands):
    """Blocks that are already pages (a power of two <= 128) need no launch:
    the page table is the block table's first columns. Others expand."""
    torch._dynamo.reset()
    cfg = mla_dcp.VerifyConfig(num_heads=4, qlen=2, block_size=block_size, max_model_len=1024, kv_lora_rank=32,
                               rope_dim=16, softmax_scale=0.1)
    seq_lens = torch.tensor([5, 700], dtype=torch.int32)
    table = torch.randperm(512, dtype=torch.int32)[:2 * cfg.min_table_blocks].view(2, -1)
    view = mla_dcp.build_view(cfg, seq_lens, table)
    assert torch.equal(view.page_table, pure.expand_page_table(table, block_size, cfg.max_local_len))
    assert (view.page_table.data_ptr() == table.data_ptr()) is not expands
    compiled, graphs = compiled_capturing(mla_dcp.build_view)
    compiled(cfg, seq_lens, table)
    targets = call_targets(graphs[0])
    assert ("mla_dcp.expand_pages.default" in targets) is expands


def test_eager_calls_go_to_the_launcher_and_traced_calls_to_the_op(monkeypatch):
    """Eager CUDA calls skip the dispatcher (its host cost dominates a small
    step); a compiled step must still hold one op node per stage."""
    from mla_dcp.ops import library

    problem = problem_on("cpu")
    shard = problem.shards[0]
    cfg = shard.cfg
    called = []
    for name in list(library._LAUNCHERS) or ["row_lens", "segmented_attention", "merge_segments"]:
        op = getattr(library, name)
        monkeypatch.setitem(library._LAUNCHERS, name, lambda *args, op=op, name=name: called.append(name) or op(*args))
    monkeypatch.setattr(library, "plain_eager_cuda", lambda tensor: True)   # pretend: plain CUDA tensors
    want = step(cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
    assert called == ["step_metadata", "merged_attention"]

    called.clear()
    torch._dynamo.reset()
    compiled, graphs = compiled_capturing(step)
    got = compiled(cfg, problem.seq_lens, shard.block_table, problem.q,
                                                                 shard.kv_cache, None)
    assert called == []
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    targets = call_targets(graphs[0])
    assert "mla_dcp.merged_attention.default" in targets and "mla_dcp.step_metadata_auto.default" in targets


def test_only_plain_eager_cuda_tensors_skip_the_dispatcher():
    from mla_dcp.ops import library

    assert not library.plain_eager_cuda(torch.zeros(2))               # CPU
    assert not library.plain_eager_cuda(torch.zeros(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(2))
        assert not library.plain_eager_cuda(fake)


class OneSegment(TestCase):
    def test_one_segment_fuses_stages_3_and_4_into_one_node(self):
        """With one segment the step is row lengths + one attention op that
        normalises in place; same bits as the two-op path on the CPU."""
        torch._dynamo.reset()
        problem = problem_on("cpu")
        shard = problem.shards[1]
        cfg = dataclasses.replace(shard.cfg, num_segments=1)
        compiled, graphs = compiled_capturing(step)
        got = compiled(cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        self.assertExpectedInline("\n".join(call_targets(graphs[0])), """\
<built-in function getitem>
mla_dcp.step_metadata.default
<built-in function getitem>
<built-in function getitem>
<built-in function getitem>
mla_dcp.merged_attention.default
<built-in function getitem>
<built-in function getitem>""")
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
        seg = ops.segmented_attention(problem.q, shard.kv_cache, None, view.row_lens, view.page_table, view.work,
                                      cfg.qlen, cfg.kv_lora_rank, cfg.scale)
        want = ops.merge_segments(*seg, view.segments, problem.q.dtype)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fp8_products_compiles_to_one_graph_equal_to_eager():
    problem = problem_on("cpu", torch.float16, torch.float8_e4m3fn)
    shard = problem.shards[1]
    cfg = dataclasses.replace(shard.cfg, fp8_products=True)

    def step(seq_lens, table, q, kv, kv_scale):
        return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table), q, kv, kv_scale)

    torch._dynamo.reset()
    args = (problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, problem.kv_scale)
    eager = step(*args)
    compiled = torch.compile(step, fullgraph=True)(*args)
    exact = mla_dcp.verify(shard.cfg, mla_dcp.build_view(shard.cfg, *args[:2]), *args[2:])
    for got, want, other in zip(compiled, eager, exact):
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
        assert not torch.equal(want.nan_to_num(7.0), other.nan_to_num(7.0))     # the mode took effect
