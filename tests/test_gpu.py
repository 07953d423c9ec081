"""GPU tests: the Triton path against the oracle and global coordinates.

Marked `gpu` (skipped without CUDA). `scripts/gpu_tests.sh` runs them all,
plus compute-sanitizer, in one go on a GPU machine.
"""

import contextlib
import math

import pytest
import torch

import mla_dcp
from mla_dcp import bench, pure
from mla_dcp.ops import library as ops
from mla_dcp.ops import launch_args
from mla_dcp.testing import (assert_close_special, check_problem, error_budget, make_problem, platform_fp8,
                             ragged_map_cases)

pytestmark = pytest.mark.gpu

FP8 = platform_fp8()

# (qlen, heads, block_size, q dtype, kv dtype, world, interleave, seq_lens)
CASES = [
    (1, 16, 16, torch.bfloat16, None, 1, 1, [0, 1, 100, 5000]),
    (2, 16, 64, torch.bfloat16, FP8, 2, 2, [0, 2, 777, 12000]),
    (3, 128, 64, torch.bfloat16, None, 2, 1, [0, 7, 40000, 1234]),
    (3, 128, 64, torch.bfloat16, FP8, 8, 1, [3, 4097, 40000]),
    (4, 64, 1, torch.bfloat16, FP8, 8, 2, [0, 3, 900, 3000]),
    (5, 64, 16, torch.float16, None, 1, 1, [5, 6, 2048]),
    (8, 128, 96, torch.bfloat16, None, 8, 2, [0, 8, 9, 20000]),
    (8, 16, 96, torch.bfloat16, FP8, 2, 1, [1, 30000]),
    (6, 64, 64, torch.float32, None, 2, 2, [0, 300, 2500]),
]


def case_id(case):
    qlen, heads, block, dtype, kv, world, interleave, lens = case
    kv_name = "fp8" if kv is not None else str(dtype).split(".")[-1]
    return f"q{qlen}-H{heads}-blk{block}-{kv_name}-W{world}-I{interleave}-L{max(lens)}"


def gpu_problem(case, seed=0, num_segments=None):
    qlen, heads, block, dtype, kv, world, interleave, lens = case
    return make_problem(lens, qlen=qlen, num_heads=heads, kv_lora_rank=512, rope_dim=64, world=world,
                        interleave=interleave, block_size=block, max_model_len=max(lens) + 64, dtype=dtype,
                        kv_dtype=kv or dtype, seed=seed, device="cuda", num_segments=num_segments)


def _native_module():
    """The native module, built (ops/native.py); the test skips where ``MLA_DCP_NATIVE=0`` turned
    the native plans off, as the library then serves every call from Python."""
    from mla_dcp.ops import native
    if not native.enabled:
        pytest.skip("MLA_DCP_NATIVE=0 turns the native plans off")
    module = native.wait()
    assert module is not None, native.error()
    return module


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_verify_matches_global_reference(case):
    problem = gpu_problem(case)
    check_problem(problem, case[3], case[4])


@pytest.mark.parametrize("stages,warp_specialize", [(2, False), (3, False), (2, True)])
@pytest.mark.parametrize("case", [c for c in CASES if c[2] % 64 == 0 and c[3] != torch.float32], ids=case_id)
def test_descriptor_kernel_matches_global_reference(case, stages, warp_specialize):
    """The TMA kernel in each variant a tuned plan may pick, on NaN-poisoned caches."""
    from mla_dcp.ops import tiles

    plan = tiles.AttentionPlan(64, 64, 8, stages, tma=True, warp_specialize=warp_specialize)
    with tiles.forced_plan(plan):
        check_problem(gpu_problem(case, seed=2), case[3], case[4])


@pytest.mark.parametrize("case", CASES[1:5], ids=case_id)
def test_every_kernel_matches_the_oracle(case):
    """Stage by stage, Triton against the pure functions on the same GPU tensors."""
    problem = gpu_problem(case, seed=1)
    qlen, dtype = case[0], case[3]
    for shard in problem.shards[:2]:
        cfg = shard.cfg
        row_lens = ops.row_lens(problem.seq_lens, qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave)
        assert torch.equal(row_lens, pure.verify_row_lens(problem.seq_lens, qlen, cfg.dcp_world_size,
                                                          cfg.dcp_rank, cfg.interleave))
        pages = ops.expand_pages(shard.block_table, cfg.block_size, cfg.max_local_len)
        assert torch.equal(pages, pure.expand_page_table(shard.block_table, cfg.block_size, cfg.max_local_len))
        ns = mla_dcp.num_segments_for(cfg, problem.seq_lens.shape[0], problem.q.device, dtype,
                                      shard.kv_cache.dtype)
        work, segments = ops.schedule(row_lens, qlen, cfg.page_size, cfg.max_pages, problem.seq_lens.shape[0] * ns)
        assert torch.equal(work, pure.build_schedule(row_lens, qlen, cfg.page_size, cfg.max_pages, work.shape[0])[0])
        got = ops.segmented_attention(problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work, qlen,
                                      cfg.kv_lora_rank, cfg.scale)
        want = pure.segmented_attention(problem.q, shard.kv_cache, row_lens, pages, work, qlen=qlen,
                                        kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale,
                                        kv_scale=problem.kv_scale)
        assert_close_special("seg_max", got[1], want[1], 1e-2 * max(1.0, want[1][want[2] > 0].abs().max().item()))
        present = want[2] > 0
        # bf16 probabilities in P@V: relative error ~ 2^-8 of the segment's mass.
        assert_close_special("seg_sum", got[2], want[2], 1e-2 * want[2].max().item())
        assert_close_special("seg_out", got[0][present], want[0][present],
                             1e-2 * want[0][present].abs().max().item())
        out, lse = ops.merge_segments(*want, segments, dtype)
        want_out, want_lse = pure.merge_segments(*want, segments, dtype)
        assert_close_special("out", out, want_out, 2 * torch.finfo(dtype).eps * want_out.abs().max().item())
        assert_close_special("lse", lse, want_lse, 1e-5 * max(1.0, want_lse[want_lse.isfinite()].abs().max().item()))


def test_merge_ranks_kernel_empty_rules():
    outs = torch.randn(4, 64, 16, 512, device="cuda").bfloat16()
    lses = torch.randn(4, 64, 16, device="cuda") * 10
    lses[:, :8] = -math.inf
    outs[:, :8] = math.nan
    lses[1, 8:16] = math.nan
    lses[2, 16:24] = math.inf
    outs[1, 8:16] = math.nan
    out, lse = mla_dcp.merge_ranks(outs, lses)
    want_out, want_lse = pure.merge_ranks(outs, lses)
    assert bool((out[:8] == 0).all()) and bool(lse[:8].isneginf().all())
    # NaN on rank 1 poisons rows 8-15 (DESIGN stage 5); +inf on rank 2 is "no key".
    assert bool(out[8:16].isnan().all()) and bool(lse[8:16].isnan().all()) and bool(lse[16:].isfinite().all())
    finite = want_out.float()[want_out.isfinite()]
    assert_close_special("out", out, want_out, 2 * 2 ** -8 * finite.abs().max().item())
    assert_close_special("lse", lse, want_lse, 1e-5 * want_lse[want_lse.isfinite()].abs().max().item())


@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_opcheck_cuda(kv):
    problem = gpu_problem((3, 16, 16, torch.bfloat16, FP8 if kv == "fp8" else None, 2, 1, [9, 40, 300]))
    shard = problem.shards[0]
    cfg = shard.cfg
    row_lens = ops.row_lens(problem.seq_lens, 3, 2, 0, 1)
    pages = ops.expand_pages(shard.block_table, cfg.block_size, cfg.max_local_len)
    work, segments = ops.schedule(row_lens, 3, cfg.page_size, cfg.max_pages, 3 * 2)
    single, _ = ops.schedule(row_lens, 3, cfg.page_size, cfg.max_pages, 3)
    seg = ops.segmented_attention(problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work, 3,
                                  cfg.kv_lora_rank, cfg.scale)
    seg = (torch.nan_to_num(seg[0]),) + seg[1:]
    out, lse = ops.merge_segments(*seg, segments, torch.bfloat16)
    utils = ("test_faketensor", "test_aot_dispatch_static")
    for op, args in [(ops.row_lens, (problem.seq_lens, 3, 2, 0, 1)),
                     (ops.expand_pages, (shard.block_table, cfg.block_size, cfg.max_local_len)),
                     (ops.schedule, (row_lens, 3, cfg.page_size, cfg.max_pages, 6)),
                     # One item a request, every row with keys in it: opcheck compares whole outputs, and a
                     # row with no key in its segment leaves seg_out unwritten (unspecified).
                     (ops.segmented_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, single,
                                                3, cfg.kv_lora_rank, cfg.scale)),
                     (ops.single_segment_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages,
                                                     single, 3, cfg.kv_lora_rank, cfg.scale)),
                     (ops.merged_attention, (problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, single,
                                             ops.schedule(row_lens, 3, cfg.page_size, cfg.max_pages, 3)[1], 3,
                                             cfg.kv_lora_rank, cfg.scale)),
                     (ops.merge_segments, (*seg, segments, torch.bfloat16)),
                     (ops.merge_ranks, (torch.stack([out, out]), torch.stack([lse, lse - 1])))]:
        torch.library.opcheck(op, args, test_utils=(("test_schema",) if kv == "same" else ()) + utils)


def _step(cfg, seq_lens, block_table, q, kv_cache, kv_scale):
    view = mla_dcp.build_view(cfg, seq_lens, block_table)
    return mla_dcp.verify(cfg, view, q, kv_cache, kv_scale)


def test_compiled_fullgraph_equals_eager():
    problem = gpu_problem((3, 128, 64, torch.bfloat16, FP8, 2, 1, [0, 9, 5000]))
    shard = problem.shards[1]
    args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, problem.kv_scale)
    got = torch.compile(_step, fullgraph=True)(*args)
    want = _step(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_compiled_step_follows_a_changing_batch_size():
    """The real kernels under torch.compile's dynamic-shape graph: every batch
    size equal to eager bit for bit (the fakes and the launchers' plans take
    a batch the graph does not fix). One config: the longest length is the same in every case."""
    torch._dynamo.reset()
    cases = {batch: gpu_problem((2, 16, 64, torch.bfloat16, None, 2, 1, [1000 * (b + 1) for b in range(batch - 1)] + [9000]),
                                seed=batch) for batch in (2, 3, 5, 1, 6)}
    compiled = torch.compile(_step, fullgraph=True)
    for batch, problem in cases.items():
        shard = problem.shards[1]
        args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        got, want = compiled(*args), _step(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {batch}"


@pytest.mark.parametrize("qlen", [4, 2], ids=["seesaw_rows", "narrow_rows"])
def test_a_compiled_step_keeps_one_graph_over_a_dozen_batch_sizes(qlen):
    """Engines send every batch size. The GPU's segment count follows the batch
    at nearly every size (tiles.segment_choice), so a graph that computed it
    would be traced again at each size, and with fullgraph=True fail at
    torch.compile's recompile limit (8). The compiled step holds no such
    choice: three graphs at most (the first size, the dynamic one, size 1),
    each size equal to eager bit for bit. 64 and 32 rows a request: the
    seesaw's one piece a program and the narrow kernel's stream (its work
    columns follow the batch too)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(_step, fullgraph=True)
    for batch in (6, 7, 5, 8, 9, 4, 10, 11, 3, 12, 13, 2, 16, 1):
        # A static bound of 1563 pages a rank: the segment count varies with the batch there.
        problem = make_problem([300 * b + 17 for b in range(batch - 1)] + [9000], qlen=qlen, num_heads=16,
                               kv_lora_rank=512, rope_dim=64, world=2, block_size=64, max_model_len=200_000,
                               dtype=torch.bfloat16, seed=batch, device="cuda")
        shard = problem.shards[1]
        args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
        got, want = compiled(*args), _step(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {batch}"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 3


@pytest.mark.parametrize("segments", [None, 1], ids=["merged", "one_segment"])
def test_ops_outputs_share_no_storage_once_their_plans_go_native(segments, monkeypatch):
    """A custom op's outputs may alias nothing (torch.compile checks them on a compiled function's
    first call: a warning, an error where ``error_on_custom_op_aliasing`` is set, as under CI). The
    launchers' plans, which the ops return, allocate each output apart once they go native (the
    API's own plans may give one block); a step compiled after they did passes that check."""
    from mla_dcp.ops import fast_launch, native
    _native_module()
    fast_launch.clear()
    problem = gpu_problem((2, 16, 64, torch.bfloat16, None, 2, 1, [7, 3000, 9000]), num_segments=segments)
    shard = problem.shards[1]
    cfg = shard.cfg
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
    facts = mla_dcp.api._facts(cfg)
    num_items, programs = mla_dcp.api._schedule_shape_memo(cfg, problem.seq_lens.shape[0], problem.q.device,
                                                          problem.q.dtype, shard.kv_cache.dtype)
    calls = {
        "step_metadata": lambda: torch.ops.mla_dcp.step_metadata(
            problem.seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.causal,
            facts.page_size, facts.max_pages, num_items, facts.schedule_chunk, programs),
        "merged_attention": lambda: torch.ops.mla_dcp.merged_attention(
            problem.q, shard.kv_cache, None, view.row_lens, view.page_table, view.work, view.segments, cfg.qlen,
            cfg.kv_lora_rank, cfg.scale),
    }
    for name, call in calls.items():
        for _ in range(3):     # the full path, the launcher's Python plan (which then goes native), native
            outs = call()
        plans = launchers_plans(name)
        assert plans and all(p.native is not None for p in plans), (name, native.refusals)
        storages = {t.untyped_storage().data_ptr() for t in outs}
        assert len(storages) == len(outs), f"{name}: outputs share a storage"
    monkeypatch.setattr(torch._functorch.config, "error_on_custom_op_aliasing", True)
    torch._dynamo.reset()
    args = (cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
    got, want = torch.compile(_step, fullgraph=True)(*args), _step(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def launchers_plans(name):
    """The launcher-level plans (fast_launch.Sequence) one op's launcher keeps."""
    from mla_dcp.ops import launchers
    table = {"step_metadata": launchers._METADATA_PLANS, "merged_attention": launchers._MERGED_PLANS}[name]
    return [p for p in table.values() if p is not None]


def test_exported_step_runs_the_real_kernels_equal_to_eager():
    """torch.export on the GPU (the schedule's shapes are the device's), then
    run on other (shorter) lengths: bit for bit the eager step."""
    problem = gpu_problem((3, 128, 64, torch.bfloat16, None, 2, 1, [0, 9, 5000, 700]))
    shard = problem.shards[1]

    class Step(torch.nn.Module):
        def forward(self, seq_lens, block_table, q, kv_cache):
            return _step(shard.cfg, seq_lens, block_table, q, kv_cache, None)

    exported = torch.export.export(Step(), (problem.seq_lens, shard.block_table, problem.q, shard.kv_cache))
    for lens in ([0, 9, 5000, 700], [0, 5, 4097, 1]):   # within the blocks each request holds
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        args = (seq_lens, shard.block_table, problem.q, shard.kv_cache)
        got, want = exported.module()(*args), Step()(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), lens


# On the H200 machine (torch 2.11) aoti_load_package segfaults in its loader on a package holding
# any mla_dcp op, a package of row_lens alone included, and (on an H100, torch 2.11) on a package
# of a plain Python custom op too: torch's loader, not these ops (the same packages load and run on
# the CPU under torch 2.13, tests/test_compile.py); not run there, as a crash takes the worker down.
@pytest.mark.xfail(torch.torch_version.TorchVersion(torch.__version__) < "2.13", run=False,
                   reason="torch 2.11's AOTInductor loader segfaults on these packages on the GPU")
def test_an_aot_inductor_package_runs_the_real_kernels_equal_to_eager(tmp_path):
    """An AOTInductor package of the step on the GPU (its C++ wrapper calls the ops, whose CUDA
    kernels are the launchers), the batch dynamic: bit for bit the eager step at other lengths and
    batch sizes."""
    problem = gpu_problem((3, 128, 64, torch.bfloat16, None, 2, 1, [0, 9, 5000, 700]))
    shard = problem.shards[1]

    class Step(torch.nn.Module):
        def forward(self, seq_lens, block_table, q, kv_cache):
            return _step(shard.cfg, seq_lens, block_table, q, kv_cache, None)

    batch = torch.export.Dim("batch", min=2, max=16)
    dynamic = {"seq_lens": {0: batch}, "block_table": {0: batch}, "q": {0: shard.cfg.qlen * batch}, "kv_cache": None}
    exported = torch.export.export(Step(), (problem.seq_lens, shard.block_table, problem.q, shard.kv_cache),
                                   dynamic_shapes=dynamic)
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "step.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    qlen = shard.cfg.qlen
    # Requests 0-3, then 2-3 alone; lengths within the blocks each request holds.
    for first, lens in ((0, [0, 9, 5000, 700]), (0, [0, 5, 4097, 1]), (2, [4000, 600])):
        rows = slice(first * qlen, (first + len(lens)) * qlen)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        args = (seq_lens, shard.block_table[first:first + len(lens)], problem.q[rows], shard.kv_cache)
        got, want = runner(*args), Step()(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), lens


def test_a_compiled_step_survives_eager_calls_and_new_environment_variables(monkeypatch):
    """Neither an eager call (the first one sets the API's eager plans up and
    builds the native plans) nor a variable set in the environment after
    compiling recompiles the step: its guards read neither."""
    from mla_dcp import api

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    problem = gpu_problem((3, 64, 16, torch.bfloat16, None, 2, 2, [200, 4000, 9000, 64]))
    shard = problem.shards[0]
    args = (shard.cfg, problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
    monkeypatch.setattr(api, "_EAGER", None)     # as in a process whose first call is compiled
    compiled = torch.compile(_step, fullgraph=True)
    first = compiled(*args)
    want = _step(*args)
    monkeypatch.setenv("MLA_DCP_TEST_SET_AFTER_COMPILING", "1")
    got = compiled(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(first[0], want[0]) and torch.equal(first[1], want[1])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("mode", ["cuda_graph", "reduce-overhead"])
def test_capture_change_lengths_replay(mode):
    """Capture once; change device-side lengths (longer, shorter, padding); replay."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    lens = [200, 4000, 9000, 64]
    problem = gpu_problem((3, 64, 16, torch.bfloat16, None, 2, 2, lens))
    shard = problem.shards[0]
    seq_lens = torch.tensor([100, 4000, 50, 64], dtype=torch.int32, device="cuda")
    args = (shard.cfg, seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
    if mode == "cuda_graph":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                _step(*args)   # warm-up: compile the kernels outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = _step(*args)

        def run():
            graph.replay()
            return static_out
    else:
        compiled = torch.compile(_step, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            compiled(*args)

        def run():
            return tuple(t.clone() for t in compiled(*args))

    # The schedule is rebuilt inside the graph from the new lengths: one long request among short
    # ones gets most work items, and the replay equals an eager step bit for bit.
    for new in ([200, 10, 9000, 0], [1, 4000, 8999, 64], [0, 0, 0, 0], [3, 2, 9000, 1], [200, 4000, 9000, 64]):
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        out, lse = run()
        want_out, want_lse = _step(*args)
        torch.cuda.synchronize()
        assert_close_special("out", out, want_out, 0.0)
        assert_close_special("lse", lse, want_lse, 0.0)
    if mode == "reduce-overhead":
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
        # Inductor captured it: no size the graph leaves open (which CUDA graph trees refuse).
        assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


@pytest.mark.parametrize("qlen, heads", [(2, 16), (3, 128)])
def test_dependent_launch_changes_no_bit(qlen, heads, monkeypatch):
    """Each kernel of a step starts while the previous one finishes
    (programmatic dependent launch on Hopper); with it off, the same kernels
    run in plain stream order. Under a CUDA graph whose replays change the
    lengths (so a kernel that read the previous replay's row lengths or
    partials would differ) both give the same bits. 16 heads take the
    narrow kernel, 128 the seesaw; three segments add the merge."""
    from mla_dcp.ops import launchers
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    assert launchers.pdl_options(torch.device("cuda"))["launch_pdl"]
    lens = [3000, 70, 9000]
    problem = gpu_problem((qlen, heads, 64, torch.bfloat16, None, 2, 1, lens), num_segments=3)
    shard = problem.shards[0]
    seq_lens = problem.seq_lens.clone()
    args = (shard.cfg, seq_lens, shard.block_table, problem.q, shard.kv_cache, None)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _step(*args)   # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        static_out = _step(*args)
    # Each request keeps within the blocks it was given.
    for new in ([2000, 64, 1], [3000, 70, 9000], [5, 1, 8999]):
        seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        monkeypatch.setenv("MLA_DCP_PDL", "0")
        launch_args.forget_devices()
        assert not launch_args.pdl_options(torch.device("cuda"))["launch_pdl"]
        want = _step(*args)
        monkeypatch.delenv("MLA_DCP_PDL")
        launch_args.forget_devices()
        torch.cuda.synchronize()
        # Zero tolerance: the same bits, NaN (rows past the static bound) and inf in the same places.
        assert_close_special(f"out {new}", static_out[0], want[0], 0.0)
        assert_close_special(f"lse {new}", static_out[1], want[1], 0.0)


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_verify_path_never_syncs_the_host(kv):
    """build_view, verify and merge_ranks with CUDA's sync debug mode set to error."""
    problem = gpu_problem((3, 64, 64, torch.bfloat16, FP8 if kv == "fp8" else None, 2, 1, [0, 9, 3000]))
    args = [(shard, mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)) for shard in problem.shards]
    for shard, view in args:                      # compile the kernels first
        mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        partials = []
        for shard, _ in args:
            view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
            partials.append(mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale))
        out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    exact_out, _ = problem.reference()
    assert_close_special("out", out, exact_out,
                         error_budget(exact_out, problem.reference(torch.bfloat16)[0], torch.bfloat16))


def test_rows_past_the_static_bound_are_nan_on_the_gpu():
    """The Triton path reads nothing past the page table and poisons those rows."""
    problem = make_problem([50, 60], qlen=2, world=2, block_size=16, max_model_len=64, seed=4, num_heads=64,
                           kv_lora_rank=512, rope_dim=64, dtype=torch.bfloat16, device="cuda")
    too_long = torch.tensor([50, 200], dtype=torch.int32, device="cuda")
    partials = []
    for shard in problem.shards:
        view = mla_dcp.build_view(shard.cfg, too_long, shard.block_table)
        partials.append(mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache))
    out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
    assert bool(out[2:].isnan().all()) and bool(lse[2:].isnan().all())
    exact_out, _ = problem.reference()
    assert_close_special("request 0", out[:2], exact_out[:2],
                         error_budget(exact_out[:2], problem.reference(torch.bfloat16)[0][:2], torch.bfloat16))


def test_eager_direct_launch_equals_the_op_and_profiles_show_the_op():
    """Plain eager calls go straight to the launchers; under the profiler they
    go through the dispatcher (so traces name the ops). Same bits either way."""
    problem = gpu_problem(CASES[2])
    shard = problem.shards[0]
    cfg = shard.cfg
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
    direct = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dispatched = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    names = {event.name for event in prof.events()}
    assert "mla_dcp::merged_attention" in names and "mla_dcp::step_metadata" not in names   # the view is built
    assert torch.equal(direct[0], dispatched[0]) and torch.equal(direct[1], dispatched[1])


def test_native_plans_leave_modes_and_the_profiler_the_ops(monkeypatch):
    """Once a step's plans are native, a call under the profiler, a dispatch mode or a function mode
    still goes through the ops (the API leaves those checks to the C++ call, which refuses), with
    the same bits; outside them the native plans serve again."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from mla_dcp import api
    from mla_dcp.ops import fast_launch
    _native_module()
    seen, served = [], []
    real = fast_launch.Sequence.run_native

    def run_native(self, inputs):
        made = real(self, inputs)
        served.append(made is not None)
        return made

    monkeypatch.setattr(fast_launch.Sequence, "run_native", run_native)

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    problem = gpu_problem(CASES[2])
    shard = problem.shards[0]
    cfg = shard.cfg

    def step():
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
        return (*view[:4], *mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale))

    for _ in range(3):
        want = step()
    served.clear()
    got = step()
    assert served == [True, True]          # build_view's and verify's native plans
    assert all(torch.equal(g.nan_to_num(), w.nan_to_num()) for g, w in zip(got, want))
    for mode in (Dispatch, Function):
        seen.clear(), served.clear()
        with mode():
            got = step()
        assert served and not any(served), (mode, served)
        assert all(torch.equal(g.nan_to_num(), w.nan_to_num()) for g, w in zip(got, want))
        if mode is Dispatch:
            assert any("mla_dcp" in name and "merged_attention" in name for name in seen), seen
            assert any("mla_dcp" in name and "step_metadata" in name for name in seen), seen
    served.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = step()
    names = {event.name for event in prof.events()}
    assert {"mla_dcp::merged_attention", "mla_dcp::step_metadata"} <= names, names
    assert not any(served), served
    assert all(torch.equal(g.nan_to_num(), w.nan_to_num()) for g, w in zip(got, want))
    served.clear()
    with pytest.MonkeyPatch.context() as patch:      # and outside them, the native plans alone
        patch.setattr(api, "_build_view", None)
        patch.setitem(ops._LAUNCHERS, "merged_attention", None)
        got = step()
    assert served == [True, True]
    assert all(torch.equal(g.nan_to_num(), w.nan_to_num()) for g, w in zip(got, want))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_eager_step_plans_replay_bit_for_bit(case, monkeypatch):
    """A repeated eager verify layout launches from its step plan (api: one fast_launch.Sequence):
    with new lengths, new queries and another cache of the same layout (another address: the
    descriptors are encoded again), the same bits as the full path, and verify calls no launcher."""
    from mla_dcp import api
    problem = gpu_problem(case)
    shard = problem.shards[-1]
    cfg = shard.cfg
    full = []
    from mla_dcp.ops import launchers
    real = launchers.merged_attention   # not _LAUNCHERS' entry: before first use it rebinds itself
    monkeypatch.setitem(ops._LAUNCHERS, "merged_attention", lambda *a: (full.append(1), real(*a))[1])

    def step(seq_lens, q, kv):
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        return (*view[:4], *mla_dcp.verify(cfg, view, q, kv, problem.kv_scale))

    step(problem.seq_lens, problem.q, shard.kv_cache)
    made = len(full)
    assert made == 1, "the first verify did not take its launcher"
    seq_lens = (problem.seq_lens - 1).clamp_(min=0)
    q, kv = problem.q * 0.5, shard.kv_cache.clone()
    got = step(seq_lens, q, kv)
    assert len(full) == made, "the second verify took its launcher"
    for plans in api._eager_plans()[0]._PLANS:
        plans.clear()
    want = step(seq_lens, q, kv)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_native_plans_replay_bit_for_bit(case):
    """With the native module built (ops/native.py), a repeated eager step launches from C++: its
    verify plan, the launchers' plans and build_view's metadata plan all go native, and with new
    lengths, new queries and another cache (another address: the tensor maps are encoded again)
    give the bits the Python plans give; a call with another layout takes the Python path."""
    from mla_dcp import api
    from mla_dcp.ops import fast_launch, native
    _native_module()
    fast_launch.clear()       # only this step's plans below
    problem = gpu_problem(case)
    shard = problem.shards[-1]
    cfg = shard.cfg

    def step(seq_lens, q, kv):
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        return (*view[:4], *mla_dcp.verify(cfg, view, q, kv, problem.kv_scale))

    for _ in range(3):       # the full path, the Python plans (which then go native), native
        step(problem.seq_lens, problem.q, shard.kv_cache)
    _, verify_plans, native_verify, native_view = api._eager_plans()
    sequences = [p.sequence for p in verify_plans.values() if p is not None]
    assert sequences and all(s.native is not None for s in sequences), native.refusals
    assert len(native_verify) == 1 and len(native_view) == 1 and None not in native_view.values()
    # The API's outputs are its own (no op's): one block for a call's outputs.
    assert all(s.native.allocation == 2 for s in sequences)
    assert all(p.sequence.native.allocation == 2 for p in native_view.values())
    seq_lens = (problem.seq_lens - 1).clamp_(min=0)
    q, kv = problem.q * 0.5, shard.kv_cache.clone()
    # Served by the API's native plans alone: neither the Python build_view nor a launcher runs.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "_build_view", None)
        patch.setitem(ops._LAUNCHERS, "merged_attention", None)
        got = step(seq_lens, q, kv)
    native.enabled = False
    try:
        want = step(seq_lens, q, kv)
    finally:
        native.enabled = True
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
        # The C++ allocations make the tensors torch.empty makes.
        assert ((g.device, g.dtype, g.shape, g.stride(), g.requires_grad, g.is_inference())
                == (w.device, w.dtype, w.shape, w.stride(), w.requires_grad, w.is_inference()))
    for mode in (torch.inference_mode, torch.no_grad):
        with mode(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(api, "_build_view", None)
            patch.setitem(ops._LAUNCHERS, "merged_attention", None)
            step(seq_lens, q, kv)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            held = step(seq_lens, q, kv)
            # From torch's caching allocator: its statistics count every output (the page table
            # aside: it may be a view of the block table).
            grown = torch.cuda.memory_allocated() - before
            assert grown >= sum(t.nbytes for i, t in enumerate(held) if i != 1), grown
            assert all(t.is_inference() == (mode is torch.inference_mode) for i, t in enumerate(held) if i != 1)
            del held
    # Another layout (a sliced query: other strides) is refused by the native plan, not misread,
    # and gets the same bits from its own plans.
    wide = torch.cat([q, q], dim=-1)[..., :q.shape[-1]]
    view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    verify_plan = next(p.sequence for p in api._eager_plans()[1].values() if p is not None)
    assert verify_plan.native.run(torch.cuda.current_stream().cuda_stream,
                                  (wide, kv, problem.kv_scale, *view[:4])) is None
    sliced = step(seq_lens, wide, kv)
    for g, w in zip(sliced, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())


@pytest.mark.parametrize("route", ["tree", "sparse"])
@pytest.mark.parametrize("case", CASES[:2] + CASES[3:4] + CASES[7:8], ids=case_id)
def test_tree_and_sparse_native_plans_replay_bit_for_bit(case, route):
    """A repeated eager tree step (build_view with a block mask, verify) and verify_sparse call
    launch from C++, each one native plan (a tree's: the context's stages and the block launch, its
    context partial their scratch); with new lengths, queries, selections and another cache, the
    bits of the Python path (native plans off)."""
    from mla_dcp import api
    from mla_dcp.ops import fast_launch, native
    _native_module()
    fast_launch.clear()
    problem = gpu_problem(case)
    shard = problem.shards[-1]
    cfg, qlen = shard.cfg, case[0]
    mask = mla_dcp.tree_mask([-1 if i < 2 else i - 2 for i in range(qlen)]).cuda()

    def call(seq_lens, q, kv, seed):
        if route == "tree":
            view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, kv_dtype=kv.dtype,
                                      block_mask=mask)
            return (*view.context[:4], *mla_dcp.verify(cfg, view, q, kv, problem.kv_scale))
        view = mla_dcp.build_view(cfg, seq_lens, shard.block_table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        listed = bench.listed_positions(seq_lens, qlen, 64, cfg.dcp_world_size, cfg.interleave, cfg.dcp_rank, seed)
        return mla_dcp.verify_sparse(cfg, view, q, kv, listed[0].to(seq_lens.device), problem.kv_scale)

    for _ in range(3):       # the full path, the Python plan (which then goes native), native
        call(problem.seq_lens, problem.q, shard.kv_cache, 0)
    _, plans, natives, _ = api._eager_plans()
    kind = "masked" if route == "tree" else "sparse"
    ours = [p.sequence for k, p in plans.items() if k[0] == kind and p is not None]
    assert len(ours) == 1 and ours[0].native is not None, native.refusals
    assert [k for k in natives if k[0] == kind] == [(kind, id(cfg), problem.q.shape)]
    seq_lens = (problem.seq_lens - 1).clamp_(min=0)
    q, kv = problem.q * 0.5, shard.kv_cache.clone()
    with pytest.MonkeyPatch.context() as patch:     # served by the native plans alone
        patch.setattr(api, "_masked_anew", None)
        patch.setattr(api, "_sparse_anew", None)
        patch.setattr(api, "_build_view", None)
        got = call(seq_lens, q, kv, 1)
    native.enabled = False
    try:
        want = call(seq_lens, q, kv, 1)
    finally:
        native.enabled = True
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
    first = call(problem.seq_lens, problem.q, shard.kv_cache, 0)
    assert not torch.equal(got[-1].nan_to_num(), first[-1].nan_to_num())


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("case", CASES[:4] + CASES[7:8], ids=case_id)
def test_one_segment_normalises_in_the_attention_kernel(case, tma):
    """num_segments = 1: verify takes the fused op (no partials, no merge launch)."""
    from mla_dcp.ops import tiles

    plan = tiles.AttentionPlan(64, 64, 8, 2, tma=tma) if tma else None
    problem = gpu_problem(case, seed=3, num_segments=1)
    with (tiles.forced_plan(plan) if plan else contextlib.nullcontext()):
        check_problem(problem, case[3], case[4])


SEESAW_CASES = [c for c in CASES if c[2] % 16 == 0 and c[4] is None and c[3] != torch.float32] + [
    (2, 16, 64, torch.bfloat16, None, 1, 1, [0, 2, 777, 12000]),
    (4, 64, 128, torch.float16, None, 2, 2, [5, 64, 129, 3000]),
    (3, 128, 16, torch.bfloat16, None, 2, 1, [0, 7, 3001, 1234]),   # a box per page
    (2, 64, 32, torch.float16, None, 1, 1, [1, 33, 2047]),
    # Heads a rank holds under tensor parallelism (Kimi-K2's 64 over 8 GPUs, DeepSeek-V3's 128 over 4):
    # 16 pairs (a quarter of the seesaw's 64-row tile, half a 32-row narrow one) and 96 pairs (a
    # seesaw tile and a half; three narrow tiles of 32).
    (2, 8, 64, torch.bfloat16, None, 2, 1, [0, 5, 3000, 20000]),
    (3, 32, 64, torch.bfloat16, None, 4, 2, [1, 700, 16000]),
]


# e4m3 caches (with the cache scale make_problem draws), converted in place in shared memory (ops/gluon_kernels/seesaw.py).
SEESAW_E4M3_CASES = [
    (2, 16, 64, torch.bfloat16, FP8, 2, 2, [0, 2, 777, 12000]),
    (3, 128, 64, torch.bfloat16, FP8, 8, 1, [3, 4097, 40000]),
    (2, 64, 16, torch.float16, FP8, 1, 1, [1, 64, 65, 3000]),    # a box per page
]


@pytest.mark.parametrize("num_segments", [None, 1, 5])
@pytest.mark.parametrize("case", SEESAW_CASES + SEESAW_E4M3_CASES, ids=case_id)
def test_seesaw_kernel_matches_global_reference(case, num_segments):
    """The Gluon kernel (ops/gluon_kernels/seesaw.py) on NaN-poisoned caches, ragged lengths
    (partial and odd last tiles, empty segments), one and many segments."""
    from mla_dcp.ops import launchers, tiles

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel is built for sm_90 (wgmma)")
    plan = tiles.AttentionPlan(64, 64, 8, 2, tma=True, seesaw=True)
    with tiles.forced_plan(plan):
        check_problem(gpu_problem(case, seed=4, num_segments=num_segments), case[3], case[4])
    assert ".entry seesaw_attention_kernel" in launchers.last_attention_kernel.asm["ptx"]


NARROW_CASES = [c for c in SEESAW_CASES if c[1] <= 64] + [
    (1, 16, 64, torch.bfloat16, None, 1, 1, [1, 64, 65, 4096]),
    (3, 16, 16, torch.bfloat16, None, 2, 2, [0, 3, 1000, 9000]),  # a box per page, 48 rows: a partial tile
    # e4m3 caches (with the cache scale make_problem draws), converted in registers
    (2, 16, 64, torch.bfloat16, FP8, 2, 2, [0, 2, 777, 12000]),
    (3, 128, 64, torch.bfloat16, FP8, 8, 1, [3, 4097, 40000]),
    (2, 16, 16, torch.float16, FP8, 1, 1, [1, 64, 65, 3000]),
    (4, 8, 64, torch.bfloat16, FP8, 2, 1, [0, 3, 3000, 20000]),    # 8 heads: 32 pairs
]


@pytest.mark.parametrize("block_m, stages", [(16, 2), (32, 2), (32, 1)])
@pytest.mark.parametrize("num_segments", [None, 1, 5])
@pytest.mark.parametrize("case", NARROW_CASES, ids=case_id)
def test_narrow_kernel_matches_global_reference(case, num_segments, block_m, stages):
    """The transposed Gluon kernel (ops/gluon_kernels/narrow.py) at both widths, on the same
    poisoned caches and ragged lengths as the seesaw's."""
    from mla_dcp.ops import launchers, tiles

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel is built for sm_90 (wgmma)")
    plan = tiles.AttentionPlan(block_m, 64, 4, stages, narrow=True)
    with tiles.forced_plan(plan):
        check_problem(gpu_problem(case, seed=5, num_segments=num_segments), case[3], case[4])
    assert ".entry narrow_attention_kernel" in launchers.last_attention_kernel.asm["ptx"]
    if stages == 1:
        # Half the 228 KiB of an SM less the 1 KiB each program reserves: room for two.
        assert launchers.last_attention_kernel.metadata.shared <= 113 * 1024


STREAM_CASES = [
    (1, 16, 64, torch.bfloat16, None, 1, 1, [1, 64, 65, 4096, 0, 9000]),   # narrow kernel, 16 rows
    (2, 16, 16, torch.bfloat16, None, 2, 2, [0, 3, 1000, 9000]),           # narrow, a box per page
    # e4m3 at 32 rows: the narrow kernel (two requests: too few programs for the seesaw's 64-row plan)
    (2, 16, 64, torch.bfloat16, FP8, 2, 2, [0, 12000]),
    (2, 16, 16, torch.float16, FP8, 1, 1, [1, 64, 65, 30000]),
]


@pytest.mark.parametrize("pages, programs", [([64], 128), ([5000], 300), ([3], 128), ([40, 0, 9000, 2, 0], 200),
                                             ([2 * 46340 - 1], 46340), ([7] * 300 + [20000], 1024)])
def test_the_stream_schedule_kernel_builds_the_oracles_schedule_for_a_few_long_requests(pages, programs):
    """The compiled schedule kernel (not the interpreter): a tile row per
    request and 32-bit cuts, up to the largest product they allow; one long
    request among 300 short ones takes the 4-warp build."""
    from mla_dcp.ops import launchers

    rows = torch.tensor([64 * n for n in pages], dtype=torch.int32)
    num_items = programs + len(pages)
    got = launchers.schedule(rows.cuda(), 1, 64, 100000, num_items, 0, programs)
    want = pure.build_schedule(rows, 1, 64, 100000, num_items, programs=programs)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("pages, num_items", [
    ([64] * 32, 96), ([64] * 40, 120), ([128] * 128, 128), ([17] * 1000, 3000),   # tails of one length, or none
    ([5, 9, 5, 0, 9, 2, 5], 14), ([700, 27, 28, 73], 132),                         # ragged: the sort
    ([1 + (7 * b) % 23 for b in range(40)] + [0, 0], 60), ([9] * 300 + [4000], 602), ([3, 0, 0, 0], 4)])
def test_the_chunked_schedule_kernel_orders_tails_as_the_oracle_by_every_route(pages, num_items):
    """The compiled schedule kernel (not the interpreter): from 33 to 512 requests, tails of one
    length keep request order without the sort; ragged tails, and every batch beside those, sort."""
    from mla_dcp.ops import launchers

    rows = torch.tensor([16 * n for n in pages], dtype=torch.int32)
    got = launchers.schedule(rows.cuda(), 1, 16, 100000, num_items)
    want = pure.build_schedule(rows, 1, 16, 100000, num_items)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("case", STREAM_CASES, ids=case_id)
def test_the_stream_schedule_matches_global_reference(case, monkeypatch):
    """The stream schedule (the GPUs' default): programs run runs of
    pieces that cross requests, on the same poisoned caches and ragged
    lengths; the device schedule equals the oracle's."""
    from mla_dcp.ops import tiles

    monkeypatch.setattr(tiles, "STREAM_ON_GPU", True)
    problem = gpu_problem(case, seed=6)
    shard = problem.shards[0]
    cfg = shard.cfg
    view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table, q_dtype=case[3],
                              kv_dtype=shard.kv_cache.dtype)
    num_items, programs = mla_dcp.schedule_shape(cfg, problem.seq_lens.shape[0], problem.q.device, case[3],
                                                 shard.kv_cache.dtype)
    assert programs > 0 and view.work.shape == (num_items, 5)
    assert int((view.work[:, 4] - view.work[:, 3]).max()) > 1, "some program runs several pieces"
    want = pure.build_schedule(view.row_lens.cpu(), cfg.qlen, cfg.page_size, cfg.max_pages, num_items,
                               programs=programs)
    assert torch.equal(view.work.cpu(), want[0]) and torch.equal(view.segments.cpu(), want[1])
    check_problem(problem, case[3], case[4])


@pytest.mark.parametrize("plan", ["seesaw", "narrow16", "narrow32"])
@pytest.mark.parametrize("kv", [None, FP8])
def test_gluon_kernels_store_no_output_for_rows_without_keys(plan, kv):
    """As the Triton kernels (tests/test_triton_interpret.py): an unused item
    and a row whose window ends before its segment leave seg_out as it was."""
    from mla_dcp.ops import launchers, tiles

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are built for sm_90 (wgmma)")
    forced = (tiles.AttentionPlan(64, 64, 8, 2, tma=True, seesaw=True) if plan == "seesaw"
              else tiles.AttentionPlan(int(plan[6:]), 64, 4, 2, narrow=True))
    problem = gpu_problem((3, 16, 64, torch.bfloat16, kv, 1, 1, [0, 129, 300]), seed=3)
    shard = problem.shards[0]
    cfg = shard.cfg
    row_lens = pure.verify_row_lens(problem.seq_lens, cfg.qlen, 1, 0, 1).cuda()
    # 2-page segments: request 1's third holds only its last row's 129th key; 4 of 10 items unused.
    work, _ = pure.build_schedule(row_lens.cpu(), cfg.qlen, cfg.page_size, cfg.max_pages, 10, chunk=2)
    work = work.cuda()
    outputs = [torch.full((10, 16, 3, 512), 7.0, device="cuda"), torch.empty(10, 16, 3, device="cuda"),
               torch.empty(10, 16, 3, device="cuda")]
    with tiles.forced_plan(forced):
        pages = pure.expand_page_table(shard.block_table, cfg.block_size, cfg.max_local_len)
        launchers._launch_attention(problem.q, shard.kv_cache, problem.kv_scale, row_lens, pages, work,
                                    cfg.qlen, 512, cfg.scale, outputs, finalize=False)
    kernel = "seesaw" if plan == "seesaw" else "narrow"
    assert f".entry {kernel}_attention_kernel" in launchers.last_attention_kernel.asm["ptx"]
    seg_out, _, seg_sum = (t.cpu() for t in outputs)
    keyless = seg_sum == 0
    assert keyless[work.cpu()[:, 2] == 0].all() and keyless.any(dim=(1, 2)).sum() > 4
    assert (seg_out[keyless] == 7.0).all()
    assert (seg_out[~keyless] != 7.0).all()


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_the_ragged_map_kernel_equals_the_oracle_on_the_gpu(index_dtype):
    """ragged_blocks' map, one launch on a GPU, against pure.ragged_map (mla_dcp.testing's cases,
    random batches of up to 300 requests)."""
    from mla_dcp.ops import launchers

    for starts, qlen, tokens in ragged_map_cases(30, 300):
        starts = torch.tensor(starts, dtype=index_dtype, device="cuda")
        got, want = launchers.ragged_map(starts, qlen, tokens), pure.ragged_map(starts, qlen, tokens)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype == torch.int32 and torch.equal(g, w), (starts.tolist(), qlen)


@pytest.mark.parametrize("stream", [False, True])
def test_the_metadata_kernel_of_a_masked_views_context_equals_the_oracle_on_the_gpu(stream):
    """step_metadata with ``context`` (a masked view's context: max(L - qlen, 0) keys, every row all
    of them) against the pure path, for lengths below, at and above qlen."""
    from mla_dcp.ops import launchers

    g = torch.Generator().manual_seed(5)
    for qlen, world, rank, interleave in [(1, 1, 0, 1), (3, 2, 1, 2), (5, 8, 3, 1), (8, 3, 2, 4)]:
        lens = torch.cat([torch.arange(0, 2 * qlen + 1), torch.randint(0, 40000, (40,), generator=g)])
        seq_lens = lens.to(torch.int32).cuda()
        batch, max_pages = seq_lens.shape[0], 40000 // 64 + 1
        num_items, programs = (132 + batch, 132) if stream else (3 * batch, 0)
        got = launchers.step_metadata(seq_lens, qlen, world, rank, interleave, False, 64, max_pages, num_items, 0,
                                      programs, True)
        rows = pure.verify_row_lens((seq_lens - qlen).clamp_min(0), qlen, world, rank, interleave, causal=False)
        want = (rows, *pure.build_schedule(rows, qlen, 64, max_pages, num_items, programs=programs))
        for g_, w in zip(got, want):
            assert torch.equal(g_, w), (qlen, world, rank, interleave)
