"""The Gluon kernels (ops/gluon_kernels/seesaw.py, ops/gluon_kernels/narrow.py) on the CPU: they build
for sm_90 with the installed Triton (no GPU needed: ptxas ships with Triton),
within the shared-memory limit, with wgmma (and, for the seesaw,
per-warpgroup register allotment); and the launcher sends them only launches
they fit. Their numerics run in
tests/test_gpu.py."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")
seesaw = pytest.importorskip("mla_dcp.ops.gluon_kernels.seesaw")
gluon_helpers = pytest.importorskip("mla_dcp.ops.gluon_kernels.helpers")
narrow = pytest.importorskip("mla_dcp.ops.gluon_kernels.narrow")

from mla_dcp.ops import launchers  # noqa: E402

H100_SHARED_LIMIT = 227 * 1024
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _build_stdout(*args) -> str:
    """stdout of ``python args`` run to compile Gluon kernels for sm_90, in a fresh interpreter
    without TRITON_INTERPRET: under it (as in this suite) every jit function is interpreted and
    cannot be compiled. Skips where Triton ships no ptxas for this platform."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0 and "ptxas" in run.stderr:
        pytest.skip("no ptxas for this platform")
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def compiled():
    stdout = _build_stdout(str(ROOT / "scripts" / "gluon_compile.py"), "--json")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_every_kernel_of_a_step_waits_for_the_previous_before_touching_memory(compiled):
    # Launched with programmatic dependent launch on the GPU: a kernel that
    # read or wrote global memory before griddepcontrol.wait would race the
    # kernel before it in the stream.
    names = [v.get("kernel") or v["triton_kernel"] for v in compiled]
    assert names.count("seesaw") == 3 and names.count("seesaw-fp8p") == 2 and {"row_lens", "expand_pages", "attention_pointer", "attention_tma",
                                           "attention_tma_ws", "merge_segments", "merge_ranks"} <= set(names)
    for variant in compiled:
        assert variant["griddepcontrol"] == 2, variant   # wait, then launch_dependents
        assert variant["waits_first"], variant


def test_builds_for_sm90_within_shared_memory(compiled):
    compiled = [v for v in compiled if "kernel" in v]
    assert [(v["kernel"], v["finalize"], v["page"]) for v in compiled] == [
        ("seesaw", False, 64), ("seesaw", True, 64), ("seesaw", True, 16),
        ("narrow32", False, 64), ("narrow32", True, 16), ("narrow16", False, 64), ("narrow32-fp8", False, 64),
        ("narrow32-s1", False, 64), ("seesaw-fp8", False, 64), ("seesaw-fp8", True, 16),
        ("seesaw-fp8p", False, 64), ("seesaw-fp8p", True, 16)]
    for variant in compiled:
        assert variant["wgmma"] > 0
        assert variant["shared"] <= H100_SHARED_LIMIT
        if variant["kernel"] == "narrow32-s1":
            # One KV stage: two programs share a multiprocessor (228 KiB, 1 KiB reserved per program).
            assert variant["shared"] <= 113 * 1024
        if variant["kernel"].startswith("seesaw"):
            # Two warpgroups in separate partitions, each with its own register budget.
            assert variant["setmaxnreg"] > 0
        else:
            # q K^T (36 k-steps of 16) and two 256-row halves of V^T P^T (4 x 4 each) per tile.
            assert variant["wgmma"] == 36 + 32


def test_bf16_seesaw_keeps_its_wgmma_descriptors_out_of_local_memory(compiled):
    # Left loop-invariant, the descriptors of the pair loop's shared-memory operands (q's: 36 per
    # tile) were hoisted out of the loop and spilled (stack 248-296 B with Triton 3.6 and 3.9); one
    # warpgroup reloaded them every pair, mostly from L2. Rebuilt each pair
    # (seesaw._rebuilt_each_pair) the stack is 16-48 B (3.6) / 72-112 B (3.9); q's alone, 120-160.
    # C1 on the H200: 466 -> 394 us.
    for variant in compiled:
        if variant.get("kernel") == "seesaw":
            stack = int(re.search(r"STACK:(\d+)", variant["local"]).group(1))
            assert stack <= 128, variant


def test_q_copies_go_out_before_the_loads_the_kv_copies_wait_for(compiled):
    # The KV copies wait for two dependent loads (row lengths, page ids); q's
    # copies issued first overlap them.
    gluon_variants = [v for v in compiled if "kernel" in v]
    for variant in gluon_variants:
        if "-fp8" in variant["kernel"]:
            assert variant["q_copies_first"] is None, variant   # q goes through registers to fp16 or e4m3
        else:
            assert variant["q_copies_first"] is True, variant


def test_e4m3_q_staging_loads_are_not_split_by_barriers(compiled):
    # Over an e4m3 cache q is loaded, scaled into fp16's range and stored by each program. Stored
    # 64 columns at a time, a bar.sync between two stores into one buffer made each chunk's loads
    # wait a round trip (3 barriers in the PTX of Triton 3.6, the H200's); stored a part at a time,
    # none: C2 475.1 -> 469.9 us. Triton 3.9 merges the two passes' identical
    # loads into one and has no barrier there either way.
    for variant in compiled:
        if "-fp8" in variant.get("kernel", ""):
            assert variant["q_staging_barriers"] == 0, variant
        elif "kernel" in variant:
            assert variant["q_staging_barriers"] is None, variant


def test_fp8_products_seesaw_transposes_v_through_stmatrix(compiled):
    # fp8 wgmma takes its B operand K-major only, so each program writes V^T to shared memory.
    # Stored as loaded (4-byte stores, a warp's lanes on rows 8 apart: 8-way bank conflicts),
    # C2 with fp8 products took 592 us on the H200; converted first to a layout whose stores
    # Triton lowers to stmatrix and byte permutes, 461 (exact mode 505). Nothing else spills much.
    exact = {(v["finalize"], v["page"]): v["stmatrix"] for v in compiled if v.get("kernel") == "seesaw-fp8"}
    for variant in compiled:
        if variant.get("kernel") == "seesaw-fp8p":
            # Two 64 x 256 halves a pair for each warpgroup, 32 stmatrix.x4 a half.
            assert variant["stmatrix"] >= exact[variant["finalize"], variant["page"]] + 64, variant
            assert int(re.search(r"STACK:(\d+)", variant["local"]).group(1)) <= 128, variant


_STREAM_PROBE_BUILD = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/benchmarks/probes"]
import stream_probe
half = gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16)
rope = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
sig = {"kv_half_desc": f"tensordesc<bf16[64, 256],{half!r}>", "kv_rope_desc": f"tensordesc<bf16[64, 64],{rope!r}>",
       "page_table_ptr": "*i32", "stride_page_b": "i32", "tiles_per_request": "i32", "total_tiles": "i32",
       "hold_ns": "i32", "STAGES": "constexpr", "BLOCK_N": "constexpr"}
for stages in (1, 2, 3):
    k = triton.compile(GluonASTSource(stream_probe.stream_kernel, sig, {"STAGES": stages, "BLOCK_N": 64}, {}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(stages, k.metadata.shared, k.asm["ptx"].count("cp.async.bulk.tensor"))
"""


def test_stream_probe_kernel_copies_the_narrow_kernels_three_boxes_per_tile():
    # benchmarks/probes/stream_probe.py times C4's KV stream with the Gluon kernels' helpers; an
    # edit to them that breaks it, or a tile copied in other boxes than the narrow kernel's, must
    # fail here before device time is spent. Copy sites: S tiles before the loop, one refill in it.
    stdout = _build_stdout("-c", _STREAM_PROBE_BUILD, str(ROOT))
    builds = [tuple(int(x) for x in line.split()) for line in stdout.splitlines()]
    assert [stages for stages, _, _ in builds] == [1, 2, 3]
    for stages, shared, copies in builds:
        assert copies == 3 * (stages + 1), (stages, copies)
        assert stages * 72 * 1024 <= shared <= H100_SHARED_LIMIT, (stages, shared)


def test_stream_probe_reads_programs_stages_and_hold_from_its_variants(import_script):
    stream_probe = import_script("stream_probe")
    assert stream_probe._variant("128:2") == (128, 2, 0)
    assert stream_probe._variant("132:2:1000") == (132, 2, 1000)
    for bad in ("128", "128:4", "128:2:x", "1:2:3:4"):
        with pytest.raises(SystemExit, match="variant must be P:S or P:S:D"):
            stream_probe._variant(bad)


def test_final_outputs_are_scaled_once_per_row_not_divided_per_column(compiled):
    # A warpgroup's finalize epilogue holds 128 output elements per thread;
    # a division each (`div.full.f32`) is several instructions, a multiply one.
    # The reciprocal of each row's sum is taken once (a few rows per thread).
    for variant in compiled:
        if "kernel" in variant:
            assert variant["float_divisions"] <= 16, variant


def test_fits_16_bit_caches_without_scale_e4m3fn_with_or_without_and_pages_of_16_tokens_or_more():
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    assert gluon_helpers.fits(q, kv, None, 512, 64)
    assert gluon_helpers.fits(q, kv.to(torch.float8_e4m3fn), torch.ones(1), 512, 64)
    assert gluon_helpers.fits(q.half(), kv.to(torch.float8_e4m3fn), None, 512, 16)
    assert not gluon_helpers.fits(q, kv.to(torch.float8_e4m3fnuz), None, 512, 64)   # ROCm's flavour: Triton path
    assert not gluon_helpers.fits(q.float(), kv.to(torch.float8_e4m3fn), None, 512, 64)
    assert not gluon_helpers.fits(q, kv, torch.ones(1), 512, 64)
    assert gluon_helpers.fits(q, kv, None, 512, 16)        # a box per 16-token page
    assert not gluon_helpers.fits(q, kv, None, 512, 8)     # too many boxes per tile
    assert not gluon_helpers.fits(q.float(), kv.float(), None, 512, 64)
    assert not gluon_helpers.fits(torch.zeros(3, 16, 544, dtype=torch.bfloat16), kv[..., :544], None, 512, 64)
    # q is copied in 16-byte pieces: rows whose strides are not whole 16
    # elements (here 584 and 16 * 584 + 8) take the Triton kernels.
    padded = torch.zeros(3 * 16 * 584 + 8, dtype=torch.bfloat16)
    assert not gluon_helpers.fits(padded[:3 * 16 * 584].view(3, 16, 584)[..., :576], kv, None, 512, 64)
    assert not gluon_helpers.fits(padded.as_strided((3, 16, 576), (16 * 584 + 8, 576, 1)), kv, None, 512, 64)
    assert not gluon_helpers.fits(padded[:3 * 16 * 584].view(3, 16, 584)[..., :576], kv, None, 512, 64)
    assert gluon_helpers.fits(padded.as_strided((3, 16, 576), (16 * 576 + 16, 576, 1), 16), kv, None, 512, 64)


def test_launcher_never_sends_it_cpu_tensors():
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    assert not launchers._gluon_fits(q, kv, None, 512, 64)


def test_narrow_fits_16_bit_caches_and_e4m3fn_with_or_without_scale():
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    e4m3 = kv.to(torch.float8_e4m3fn)
    assert gluon_helpers.fits(q, kv, None, 512, 64)
    assert gluon_helpers.fits(q, e4m3, torch.ones(1), 512, 64) and gluon_helpers.fits(q, e4m3, None, 512, 16)
    assert gluon_helpers.fits(q.half(), e4m3, None, 512, 64)
    assert not gluon_helpers.fits(q, kv.to(torch.float8_e4m3fnuz), None, 512, 64)   # ROCm's flavour: Triton path
    assert not gluon_helpers.fits(q.float(), e4m3, None, 512, 64)
    assert not gluon_helpers.fits(q, kv, torch.ones(1), 512, 64)     # a scale on a 16-bit cache: Triton path
    assert not gluon_helpers.fits(q, e4m3, None, 512, 8)             # too many boxes per tile
    assert not launchers._gluon_fits(q, e4m3, None, 512, 64)   # CPU tensors never reach it


def test_descriptors_describe_the_cache_as_token_slots():
    kv = torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn)
    half, rope = gluon_helpers.descriptors(kv, 512, 16)
    # One row per token slot; boxes one 16-token page tall (a box per page below the tile).
    assert half.shape == rope.shape == [64, 576] and half.strides == [576, 1]
    assert half.block_shape == [16, 256] and rope.block_shape == [16, 64]


def test_descriptors_of_a_second_cache_with_the_same_facts_describe_that_cache():
    # The second call reuses the first's validated fields: its descriptors
    # must equal freshly built ones, hold the new tensor, and not the old one.
    import gc
    import weakref

    first = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    built = gluon_helpers.descriptors(first, 512, 16)
    gone = weakref.ref(first)
    del first, built
    gc.collect()
    assert gone() is None                       # the cache's descriptors do not keep it alive
    second = torch.ones(4, 16, 576, dtype=torch.bfloat16)
    reused = gluon_helpers.descriptors(second, 512, 16)
    fresh = [gluon_helpers.TensorDescriptor(second, d.shape, d.strides, d.block_shape, d.layout) for d in reused]
    assert all(r.base is second for r in reused) and list(reused) == fresh
    other = gluon_helpers.descriptors(torch.zeros(8, 16, 576, dtype=torch.bfloat16), 512, 16)
    assert other[0].shape == [128, 576]                                   # another shape: built again


def test_stamps_hook_compiles_only_when_a_probe_passes_a_buffer(import_script):
    # benchmarks/probes/seesaw_timeline.py launches the committed kernels with a
    # stamps buffer: each phase's global-timer read must be in that build, and
    # none in a launch without one (every real launch: the fingerprints of
    # those builds are the check that the hook adds no instruction there).
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import gluon_compile as g; "
            "builds = {(kind, stamped): g.compile_variant(False, block_m=64 if kind == 'seesaw' else 32, "
            "stamps='*i64' if stamped else None).asm['ptx'] for kind in ('seesaw', 'narrow') for stamped in (0, 1)}; "
            "print(json.dumps({f'{k}{s}': [p.count('%globaltimer'), p.count('%smid')] for (k, s), p in builds.items()}))")
    counts = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    # seesaw: entry, wait, copies issued, q staged, and per warpgroup first scores, loop end, sums, epilogue end
    assert counts == {"seesaw0": [0, 0], "seesaw1": [12, 1], "narrow0": [0, 0], "narrow1": [7, 1]}, counts
    seesaw_timeline = import_script("seesaw_timeline")
    assert seesaw_timeline.SLOTS == 16 and max(seesaw_timeline.SMID, seesaw_timeline.PAIRS) < seesaw_timeline.SLOTS
    assert seesaw_timeline.parse_spec("C4:3@narrow16") == ("C4", 3, "narrow", 16)
    assert seesaw_timeline.parse_spec("C6") == ("C6", None, "seesaw", 64)
    assert seesaw_timeline.parse_spec("C2@products") == ("C2", None, "products", 64)
    assert seesaw_timeline.MODULES["products"] is seesaw_timeline.MODULES["seesaw"]


class _RecordingKernel:
    """Stands in for a Gluon kernel: records the grid and arguments of a launch."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.grid, self.args, self.kwargs = grid, args, kwargs
            return "launched"
        return launch


def test_narrow_launch_sends_its_grid_and_shape_constants(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(narrow, "narrow_attention_kernel", kernel)
    batch, qlen, heads, max_pages = 3, 2, 16, 5
    q = torch.zeros(batch * qlen, heads, 576, dtype=torch.bfloat16)
    kv = torch.zeros(batch * max_pages, 16, 576, dtype=torch.bfloat16)
    row_lens = torch.zeros(batch * qlen, dtype=torch.int32)
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    work = torch.zeros(batch * 4, 3, dtype=torch.int32)
    outs = (torch.zeros(batch * 4, heads, qlen, 512), torch.zeros(batch * 4, heads, qlen),
            torch.zeros(batch * 4, heads, qlen))
    got = narrow.launch(q, kv, None, row_lens, table, work, qlen, 512, 0.1, outs, False, 16, 16, stages=1)
    assert got == "launched"
    assert kernel.grid == (2, 12, 1)   # 32 pairs in tiles of 16, 12 work items
    assert {k: kernel.kwargs[k] for k in ("QLEN", "H", "DL", "DR", "PAGE", "FINALIZE", "BLOCK_M", "STAGES",
                                          "HAS_KV_SCALE")} == {
        "QLEN": 2, "H": 16, "DL": 512, "DR": 64, "PAGE": 16, "FINALIZE": False, "BLOCK_M": 16, "STAGES": 1,
        "HAS_KV_SCALE": False}
    assert kernel.args[6] is work and kernel.args[7:10] == outs and kernel.args[-1] == max_pages
    with pytest.raises(ValueError, match="stages must be 1 or 2"):
        narrow.launch(q, kv, None, row_lens, table, work, qlen, 512, 0.1, outs, False, 16, 16, stages=3)


@pytest.mark.parametrize("columns, heads, want", [(3, 32, "seesaw"), (5, 32, "segmented_attention_tma_kernel"),
                                                 (3, 16, "seesaw"), (5, 16, "narrow")])
def test_a_stream_schedule_never_reaches_the_seesaw(monkeypatch, columns, heads, want):
    """The seesaw runs one piece per program: a view with the stream's five
    columns (built for other dtypes, say: an e4m3 cache's view built as for
    bf16) must go to a kernel that runs a program's pieces, or every piece
    after a program's first is never computed; at 32 pairs, the narrow
    kernel at that width rather than a 64-row Triton tile."""
    from mla_dcp.ops import tiles

    launched = []
    monkeypatch.setattr(launchers, "_gluon_fits", lambda *args: True)
    monkeypatch.setattr(launchers, "_tma_fits", lambda *args: True)
    monkeypatch.setattr(seesaw, "launch", lambda *args, **kwargs: launched.append("seesaw"))
    monkeypatch.setattr(narrow, "launch", lambda *args, **kwargs: launched.append(("narrow", args[12])))
    monkeypatch.setattr(launchers, "launch", lambda kernel, *args, **kwargs: launched.append(
        (kernel.__name__, kwargs["WORK_COLS"])))
    batch, qlen, max_pages = 2, 2, 5
    q = torch.zeros(batch * qlen, heads, 576, dtype=torch.bfloat16)
    kv = torch.zeros(batch * max_pages, 64, 576, dtype=torch.bfloat16)
    work = torch.zeros(batch * 3, columns, dtype=torch.int32)
    outs = launchers.attention_outputs(q, 512, work.shape[0], qlen, finalize=False)
    with tiles.forced_plan(tiles.AttentionPlan(64, 64, 8, 2, tma=True, seesaw=True)):
        launchers._launch_attention(q, kv, None, torch.zeros(batch * qlen, dtype=torch.int32),
                                    torch.zeros(batch, max_pages, dtype=torch.int32), work, qlen, 512, 0.1, outs,
                                    finalize=False)
    assert launched == (["seesaw"] if want == "seesaw" else [(want, 32 if want == "narrow" else 5)])


def test_a_stream_view_of_a_seesaw_step_warns(monkeypatch):
    """An e4m3 cache's view built without its dtype (a stream schedule) runs
    a slower kernel than the seesaw: its launch says how to build the view
    (on a GPU once per layout: later launches replay the plan); a view for
    these dtypes and a forced plan (the tests', the tuner's) do not."""
    import warnings

    from mla_dcp.ops import tiles

    monkeypatch.setattr(launchers, "_gluon_fits", lambda *args: True)
    monkeypatch.setattr(launchers, "attention_plan", lambda *args: tiles.AttentionPlan(64, 64, 8, 2, tma=True,
                                                                                        seesaw=True))
    monkeypatch.setattr(narrow, "launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(seesaw, "launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(launchers, "launch", lambda kernel, *args, **kwargs: None)
    batch, qlen, heads, max_pages = 3, 2, 16, 5
    q = torch.zeros(batch * qlen, heads, 576, dtype=torch.bfloat16)
    kv = torch.zeros(batch * max_pages, 64, 576, dtype=torch.bfloat16)

    def call(columns):
        work = torch.zeros(batch * 3, columns, dtype=torch.int32)
        outs = launchers.attention_outputs(q, 512, work.shape[0], qlen, finalize=False)
        launchers._launch_attention(q, kv, None, torch.zeros(batch * qlen, dtype=torch.int32),
                                    torch.zeros(batch, max_pages, dtype=torch.int32), work, qlen, 512, 0.1, outs,
                                    finalize=False)
    with pytest.warns(UserWarning, match="kv_dtype=kv_cache.dtype"):
        call(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(3)                          # a view for these dtypes
        with tiles.forced_plan(tiles.AttentionPlan(64, 64, 8, 2, tma=True, seesaw=True)):
            call(5)


@pytest.mark.parametrize("kind", ["seesaw", "narrow"])
def test_each_launch_binds_every_parameter_of_its_kernel_once(monkeypatch, kind):
    # One launch function serves both kernels: the positional arguments and
    # the options together must name each of the real kernel's parameters
    # once, the ones without a default included.
    module, name = (seesaw, "seesaw_attention_kernel") if kind == "seesaw" else (narrow, "narrow_attention_kernel")
    real = getattr(module, name)
    kernel = _RecordingKernel()
    monkeypatch.setattr(module, name, kernel)
    batch, qlen, heads, max_pages = 2, 2, 16 if kind == "narrow" else 32, 5
    q = torch.zeros(batch * qlen, heads, 576, dtype=torch.bfloat16)
    kv = torch.zeros(batch * max_pages, 64, 576, dtype=torch.bfloat16)
    row_lens = torch.zeros(batch * qlen, dtype=torch.int32)
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    work = torch.zeros(batch * 2, 3, dtype=torch.int32)
    outs = (torch.zeros(batch * qlen, heads, 512, dtype=torch.bfloat16), torch.zeros(batch * qlen, heads))
    args = (q, kv, None, row_lens, table, work, qlen, 512, 0.1, outs, True, 64)
    module.launch(*args, 16) if kind == "narrow" else module.launch(*args)
    launch_options = {"num_warps", "num_stages", "launch_pdl"}
    named = list(real.arg_names[:len(kernel.args)]) + [k for k in kernel.kwargs if k not in launch_options]
    assert sorted(named) == sorted(set(named)), named
    required = [p.name for p in real.params if not p.has_default]
    assert set(required) <= set(named) <= set(real.arg_names)
    assert kernel.args[0] is q and kernel.args[4] is row_lens and kernel.args[-1] == max_pages


def test_stage_variant_script_still_finds_its_anchors(tmp_path, import_script):
    # benchmarks/probes/stage_variants.py removes one loop stage from a copy of each
    # Gluon kernel at named markers: every variant must still build.
    stage_variants = import_script("stage_variants")
    for kind, variants in stage_variants.VARIANTS.items():
        if kind == "products":
            assert set(variants) == {"no_transpose", "no_rope", "copy"}
            continue    # built and checked by test_every_stage_variant_builds_for_sm90_without_its_products
        assert set(variants) == {"no_qk", "no_pv", "no_softmax", "loads_only", "copy"} | (
            {"no_convert", "no_convert_ahead", "no_convert_other", "no_convert_rope", "no_wait_own",
             "no_wait_other"} if kind == "seesaw" else set())
        for variant in variants:
            copy = stage_variants.variant_module(tmp_path, kind, variant)
            text = (tmp_path / f"{kind}_{variant}.py").read_text()
            kernel = copy.seesaw_attention_kernel if kind == "seesaw" else copy.narrow_attention_kernel
            assert kernel.arg_names == (seesaw.seesaw_attention_kernel if kind == "seesaw"
                                        else narrow.narrow_attention_kernel).arg_names
            # The stage is gone from the copy (and only from the copy).
            if variant in ("no_softmax", "loads_only"):
                assert "p = gl.exp2(" not in text
            if variant == "no_convert":
                assert "_convert_in_place(buf, _landing(buf, desc))" not in text
            # One conversion site each: exactly one more part is taken as converted than in the kernel.
            sites = {"no_convert_ahead": "_landed(buf, bar, phase, desc, ",
                     "no_convert_other": "_landed(k_other, bar_other, phase, half_desc, ",
                     "no_convert_rope": "_landed(k_rope, bar_rope, phase, rope_desc, "}
            if variant in sites:
                committed = pathlib.Path(seesaw.__file__).read_text()
                assert committed.count(sites[variant] + "False)") == 1 and sites[variant] + "True)" not in committed
                assert sites[variant] + "False)" not in text and text.count(sites[variant] + "True)") == 1
            # The waits for a part's copy are gone from the scores (and only from the copy).
            waits = {"no_wait_own": "_landed(k_own, ", "no_wait_other": "_landed(k_other, "}
            if variant in waits:
                committed = pathlib.Path(seesaw.__file__).read_text()
                assert text.count(waits[variant]) == committed.count(waits[variant]) - 1
            if variant == "copy":
                assert text == pathlib.Path(copy.__file__).read_text() == pathlib.Path(
                    (seesaw if kind == "seesaw" else narrow).__file__).read_text()
            if variant in ("no_pv", "loads_only"):
                assert "warpgroup_mma(k_lo.permute((1, 0)), p_smem" not in text
                # R's second V product, as the kernel spells it (present there, so the check bites).
                second_pv = "warpgroup_mma(_rebuilt_each_pair(p0_smem, k), _rebuilt_each_pair(kv_hi.index(0), k)"
                assert second_pv in pathlib.Path(seesaw.__file__).read_text()
                assert second_pv not in text


def test_ptx_fingerprints_ignore_debug_lines_only(import_script):
    gluon_compile = import_script("gluon_compile")
    ptx = "\t.loc\t1 66 0 // kernels.py:66:0\n\tld.global.b32 %r1, [%rd1]; // a comment\n"
    moved = "\t.file\t2 \"helpers.py\"\n\t.loc\t2 37 9\n\tld.global.b32 %r1, [%rd1];\n"
    changed = "\t.loc\t1 66 0\n\tld.global.b64 %rd2, [%rd1];\n"
    debug = ptx + ".section\t.debug_str\n{ .b8 104 }\n"
    assert gluon_compile.ptx_fingerprint(ptx) == gluon_compile.ptx_fingerprint(moved)
    assert gluon_compile.ptx_fingerprint(ptx) == gluon_compile.ptx_fingerprint(debug)
    assert gluon_compile.ptx_fingerprint(ptx) != gluon_compile.ptx_fingerprint(changed)


def test_triton_kernels_build_when_every_integer_argument_is_one():
    # A launch passes an integer argument equal to 1 as a constant (Triton's
    # specialisation), so `max_pages.to(...)` on a one-page bound fails to
    # build on the GPU while the interpreter, which never specialises, runs it.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gluon_compile; "
            "print(sorted(gluon_compile.compile_triton_kernels(ints_equal_one=True))); "
            "[gluon_compile.compile_variant(True, block_m=m, ints_equal_one=True) for m in (64, 16)]; print('gluon')")
    built = _build_stdout("-c", code, str(ROOT / "scripts"))
    assert "'step_metadata'" in built and "'schedule'" in built and "'expand_pages'" in built
    assert "'ragged_rows'" in built and "'ragged_tokens'" in built and "'write_cache_fp8'" in built
    assert "'block_attention'" in built and "'block_attention_fp8'" in built
    assert "'sparse_attention'" in built and "'sparse_attention_fp8'" in built and "'write_cache_ds'" in built
    assert built.strip().endswith("gluon")


def test_the_streams_builds_run_pieces_and_leave_the_one_piece_builds_alone():
    """With five work columns (the stream) each attention kernel runs its
    program's pieces in a loop (the narrow kernel restarting its barriers
    between pieces); with three its piece function is called once, so the
    build is the one without runs: no barrier restart. Both take the same
    shared memory."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import gluon_compile as g; "
            "k = g.compile_triton_kernels(); "
            "n = {c: g.compile_variant(False, qlen=2, heads=16, block_m=32, work_cols=c).asm['ptx'] for c in (3, 5)}; "
            "late = {s: (lambda p: p[p.find('st.global'):].count('ld.global'))(k[s].asm['ptx']) "
            "for s in ('schedule', 'schedule_stream')}; "
            "print(json.dumps({'triton': sorted(k), 'late': late, 'narrow3': n[3].count('mbarrier.inval'), "
            "'narrow5': n[5].count('mbarrier.inval'), 'wgmma5': n[5].count('wgmma.mma_async'), "
            "'wgmma3': n[3].count('wgmma.mma_async'), 'shared': {c: g.compile_variant(False, qlen=2, heads=16, "
            "block_m=32, stages=1, work_cols=c).metadata.shared for c in (3, 5)}}))")
    built = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    assert {"attention_pointer_stream", "attention_tma_stream", "schedule_stream", "step_metadata_stream"} <= set(
        built["triton"])
    assert built["narrow3"] == 0 and built["narrow5"] > 0
    # Neither schedule reads back what it wrote: a dependent load in its one
    # program is a memory round trip on the step's critical path.
    assert built["late"] == {"schedule": 0, "schedule_stream": 0}
    assert built["wgmma5"] == built["wgmma3"] > 0
    # The stream's pieces free their buffers at each piece's end, so the
    # epilogue's layout conversion reuses them as in the one-piece build: the
    # same shared memory, two programs per SM at 32 rows and one stage.
    assert built["shared"]["5"] == built["shared"]["3"] <= 113 * 1024


def test_the_step_metadata_kernel_builds_without_spills_up_to_2048_requests():
    # Its one program is on every step's critical path: a spill there is a
    # local-memory round trip per use. The launcher sizes the per-request
    # tiles and the warps from the batch (the stream's 16-item steps spilled
    # 8 KB a thread at 256 requests; four warps at 2048 requests 40-56 bytes;
    # under Triton 3.6 the chunked one's full tile past one warp, 8 bytes at 256 and 512).
    code = ("import sys, json, re; sys.path.insert(0, sys.argv[1]); import gluon_compile as g; "
            "print(json.dumps({f'{b} {s}': re.findall(r'STACK:(\\d+)', g.resources(g.compile_step_metadata(b, s))) "
            "for b in (1, 64, 128, 256, 512, 1024, 2048) for s in (False, True)}))")
    built = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    assert len(built) == 14 and all(stack == ["0"] for stack in built.values()), built


def test_the_segment_merge_builds_without_spills_at_the_tiles_it_launches():
    # A whole row's program (512 columns, 4 warps) reads a request's items at most 16 a step:
    # at 64, the tile before, it spilled (the control: 3944 bytes a thread under Triton 3.9, 472
    # under 3.6, the GPU machines'); the split's tile (32
    # columns, one warp) reads up to 64.
    code = ("import sys, json, re; sys.path.insert(0, sys.argv[1]); import gluon_compile as g; "
            "print(json.dumps({f'{d} {w} {c}': re.findall(r'STACK:(\\d+)', g.resources(g.compile_merge(d, w, c))) "
            "for d, w, c in ((512, 4, 16), (32, 1, 64), (512, 4, 64))}))")
    built = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    row_tile = (launchers._INVARIANT_MERGE_TILE[0], launchers._INVARIANT_MERGE_TILE[1],
                launchers._MERGE_ROW_MOST_ITEMS)
    assert row_tile == (512, 4, 16) and launchers._INVARIANT_MERGE_TILE[2] == 16
    assert (launchers._MERGE_SPLIT_BLOCK_D, launchers._MERGE_SPLIT_WARPS, launchers._MERGE_MAX_CHUNK) == (32, 1, 64)
    assert built["512 4 16"] == built["32 1 64"] == ["0"], built
    assert int(built["512 4 64"][0]) > 0, built


def test_every_stage_variant_builds_for_sm90_without_its_products():
    # The variants the stage probe times must compile, and removing a product
    # stage must remove its wgmma instructions (a marker that moved to another
    # statement would leave them); the fp8-products build's V^T stores, its stmatrix.
    code = ("import sys, json, pathlib, tempfile; sys.path[:0] = sys.argv[1:3]; "
            "import gluon_compile as g, stage_variants as sv; d = pathlib.Path(tempfile.mkdtemp()); counts = {}\n"
            "for kind, variants in sv.VARIANTS.items():\n"
            "    for v in variants:\n"
            "        c = sv.variant_module(d, kind, v)\n"
            "        k = c.narrow_attention_kernel if kind == 'narrow' else c.seesaw_attention_kernel\n"
            "        b = g.compile_variant(False, kernel=k, block_m=32 if kind == 'narrow' else 64,\n"
            "                              kv='fp8e4nv' if 'convert' in v or kind == 'products' else None,\n"
            "                              narrow_args=kind == 'narrow', fp8_products=kind == 'products')\n"
            "        ptx = b.asm['ptx']\n"
            "        counts[kind + ':' + v] = ptx.count('wgmma.mma_async')\n"
            "        counts[kind + ':' + v + ':stmatrix'] = ptx.count('stmatrix.')\n"
            "print(json.dumps(counts))")
    out = _build_stdout("-c", code, str(ROOT / "scripts"), str(ROOT / "benchmarks" / "probes"))
    counts = json.loads(out.strip().splitlines()[-1])
    # fp8 products: without V^T fewer stmatrix, the same products; without the rope part, one product less.
    assert counts["products:no_transpose:stmatrix"] < counts["products:copy:stmatrix"]
    assert counts["products:no_transpose"] == counts["products:copy"]
    assert counts["products:no_rope"] < counts["products:copy"]
    assert counts["products:no_rope:stmatrix"] == counts["products:copy:stmatrix"]
    for kind in ("seesaw", "narrow"):
        full = counts[f"{kind}:copy"]
        assert counts[f"{kind}:no_softmax"] == full
        assert counts[f"{kind}:loads_only"] < min(counts[f"{kind}:no_qk"], counts[f"{kind}:no_pv"])
        assert max(counts[f"{kind}:no_qk"], counts[f"{kind}:no_pv"]) < full
    assert all(counts[f"seesaw:{v}"] == counts["seesaw:copy"]
               for v in ("no_convert", "no_convert_ahead", "no_convert_other", "no_convert_rope", "no_wait_own",
                         "no_wait_other"))


def test_mma_shapes_probe_builds_each_product_shape_it_compares():
    # benchmarks/probes/mma_shapes.py times the fp8 V products' wgmma shapes against each other
    # (docs/performance.md, fp8 products); a mode that built another instruction than its label
    # says would time the wrong thing.
    stdout = _build_stdout(str(ROOT / "benchmarks" / "probes" / "mma_shapes.py"), "--compile")
    shapes = json.loads(stdout.strip().splitlines()[-1])
    assert shapes == {"0": ["m64n256k32"], "1": ["m64n64k32"], "2": ["m64n64k32"]}, shapes


def test_the_block_and_sparse_kernels_build_without_spills():
    # Token trees' block kernel and token-sparse rows' kernel hold [heads, 512] float32 accumulators
    # in registers: their launch shapes were picked as the ones that fit without a stack for sm_90
    # (ops/launchers.py); a spill there would be a local-memory round trip in every step of the loop.
    code = ("import sys, json, re; sys.path.insert(0, sys.argv[1]); import gluon_compile as g; "
            "k = g.compile_triton_kernels(); "
            "print(json.dumps({n: g.resources(k[n]) for n in k if n.startswith(('block_', 'sparse_'))}))")
    built = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    assert set(built) == {"block_attention", "block_attention_fp8", "sparse_slots", "sparse_attention",
                          "sparse_attention_pieces", "sparse_attention_fp8", "sparse_attention_h32",
                          "sparse_attention_ds"}, built
    assert all(re.search(r"STACK:0\b", text) and re.search(r"LOCAL:0\b", text) for text in built.values()), built


def test_fp8_products_kernels_build_for_sm90_at_narrow_latent_widths():
    # An e4m3 tl.dot needs a reduction of 32 or more on sm_90 (a 16-wide one fails to build, which
    # the interpreter never shows): the launcher pads a narrow latent to 32, and keeps the descriptor
    # kernel, whose latent halves are not padded, to halves of 32 and more.
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import gluon_compile as g\n"
            "def ok(**kw):\n"
            "    try:\n"
            "        g.compile_fp8_products_attention(**kw); return True\n"
            "    except Exception as e:\n"
            "        return type(e).__name__\n"
            "print(json.dumps({'16': ok(dl=16, dr=8), '24': ok(dl=24, dr=0), '16 at 16': ok(dl=16, dr=8, dl_pad=16),\n"
            "                  'halves 32': ok(dl=64, dr=16, descriptors=True),\n"
            "                  'halves 16': ok(dl=32, dr=16, descriptors=True)}))")
    built = json.loads(_build_stdout("-c", code, str(ROOT / "scripts")).strip().splitlines()[-1])
    assert built == {"16": True, "24": True, "16 at 16": "CompilationError", "halves 32": True,
                     "halves 16": "CompilationError"}, built


def test_fp8_products_launches_take_the_pointer_kernel_below_latent_halves_of_32(monkeypatch):
    q = torch.zeros(2, 8, 48, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 48, dtype=torch.float8_e4m3fn)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if launchers.TensorDescriptor is None:
        pytest.skip("this Triton has no host TensorDescriptor")
    assert launchers._tma_fits(q, kv, 32, 16, 64, 64) and not launchers._tma_fits(q, kv, 32, 16, 64, 64, True)
    kv = torch.zeros(4, 64, 144, dtype=torch.float8_e4m3fn)
    assert launchers._tma_fits(torch.zeros(2, 8, 144, dtype=torch.bfloat16), kv, 128, 16, 64, 64, True)
    assert launchers._dot_width(16, launchers._FP8_DOT_LEAST) == 32 and launchers._dot_width(16) == 16


def test_the_fuzz_builds_what_its_draws_launch_for_sm90():
    # kernel_fuzz --builds records each draw's launches under the interpreter and builds them for
    # sm_90; this draw launches the fp8-products pointer kernel at a 16-wide latent, the build a
    # GPU run found failing (with _FP8_DOT_LEAST at 16 the line reads "1 failed").
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_fuzz.py"), "--only", "391004504", "--builds"],
                         env=env, capture_output=True, text=True, timeout=600)
    if "ptxas" in run.stderr:
        pytest.skip("no ptxas for this platform")
    assert run.returncode == 0 and "1 distinct builds for sm_90, 0 failed" in run.stdout, run.stdout[-2000:]
