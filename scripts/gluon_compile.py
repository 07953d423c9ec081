"""Compile the Gluon kernels (seesaw, narrow) for sm_90 without a GPU and report its resources.

    python scripts/gluon_compile.py [OUT_DIR]

Needs a Triton with Gluon (3.6 is what the H200 machine runs). Prints
registers, spills and shared memory per variant (from ptxas via cuobjdump),
whether the PTX has wgmma, and writes the PTX/SASS next to OUT_DIR if given.
``--json`` adds each build's PTX fingerprint (debug information left out):
a change that only moves code keeps every fingerprint.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import pathlib
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from mla_dcp.ops.gluon_kernels import narrow, seesaw  # noqa: E402


# Integer arguments a production launch passes as multiples of 16: the row strides the step's shapes
# make so (576- and 656-byte rows, H x 576 queries, 512-wide outputs).
_ALIGNED_STRIDES = frozenset({"stride_q_row", "stride_q_head", "stride_q", "stride_kv_slot", "stride_slot",
                              "stride_co_row", "stride_co_head", "stride_latent", "stride_out"})


def _launch_attrs(kernel, sig: dict) -> dict:
    """The divisibility by 16 a launch specialises: pointers (torch's allocator aligns them) and the
    integer row strides of :data:`_ALIGNED_STRIDES`. Without it the loads are not vectorised, the
    loops not pipelined as on the GPU, and the registers counted are another build's."""
    aligned = [arg for arg, kind in sig.items()
               if kind.startswith("*") or (kind == "i32" and arg in _ALIGNED_STRIDES)]
    return {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in aligned}


def compile_variant(finalize: bool, dtype: str = "bf16", qlen: int = 3, heads: int = 128, page: int = 64,
                    block_m: int = 64, kv: str | None = None, stages: int | None = None, kernel=None,
                    narrow_args: bool | None = None, ints_equal_one: bool = False,
                    stamps: str | None = None, work_cols: int = 3, fp8_products: bool = False):
    """The seesaw kernel at 64 pairs per tile, the narrow one below (``kv``:
    the cache's dtype where it differs from q's, e.g. "fp8e4nv"; ``stages``:
    the narrow kernel's KV tiles in flight, default its module's).
    ``kernel``: another kernel with the seesaw's arguments, or with the
    narrow one's where ``narrow_args`` (a candidate such as
    a copy from benchmarks/probes/stage_variants.py). ``ints_equal_one``: the
    page table's width and stride 1 (one page per request), which a launch
    passes as constants. ``stamps``: the timeline probe's stamps pointer
    type (``"*i64"``) where the build should carry its stamps. ``work_cols``: the schedule's
    columns (5: the stream, whose programs run several pieces; the narrow kernel only).
    ``fp8_products``: the seesaw's fp8-products build (``kv`` e4m3)."""
    narrow_args = block_m != 64 if narrow_args is None else narrow_args
    dl, dr, bn = 512, 64, 64
    kv = kv or dtype
    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8e4nv": gl.float8e4nv}[kv]
    box = min(page, bn)
    half = gl.NVMMASharedLayout.get_default_for([box, dl // 2], gdt)
    rope = gl.NVMMASharedLayout.get_default_for([box, dr], gdt)
    sig = {
        "q_ptr": f"*{dtype}", "kv_half_desc": f"tensordesc<{kv}[{box}, {dl // 2}],{half!r}>",
        "kv_rope_desc": f"tensordesc<{kv}[{box}, {dr}],{rope!r}>", "row_lens_ptr": "*i32",
        "page_table_ptr": "*i32", "work_ptr": "*i32", "seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32",
        "seg_sum_ptr": "*fp32", "out_ptr": f"*{dtype}", "lse_ptr": "*fp32", "stride_q_row": "i32",
        "stride_q_head": "i32", "stride_page_b": "i32", "softmax_scale_log2": "fp32", "max_pages": "i32",
        "QLEN": "constexpr", "H": "constexpr", "DL": "constexpr", "DR": "constexpr", "PAGE": "constexpr",
        "FINALIZE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "PDL": "constexpr",
    }
    consts = {"QLEN": qlen, "H": heads, "DL": dl, "DR": dr, "PAGE": page, "FINALIZE": finalize, "BLOCK_M": block_m,
              "BLOCK_N": bn, "PDL": True}
    kernel = kernel or (narrow.narrow_attention_kernel if narrow_args else seesaw.seesaw_attention_kernel)
    if "stamps_ptr" in kernel.arg_names:   # the timeline probe's hook: absent (None), as in every launch
        sig["stamps_ptr"] = "constexpr" if stamps is None else stamps
        if stamps is None:
            consts["stamps_ptr"] = None
    sig.update({"kv_scale_ptr": "*fp32", "HAS_KV_SCALE": "constexpr"})
    consts.update({"HAS_KV_SCALE": kv != dtype})
    if "WORK_COLS" in kernel.arg_names:
        sig["WORK_COLS"] = "constexpr"
        consts["WORK_COLS"] = work_cols
    if "FP8_PRODUCTS" in kernel.arg_names:
        sig["FP8_PRODUCTS"] = "constexpr"
        consts["FP8_PRODUCTS"] = fp8_products
    if narrow_args:
        sig.update({"STAGES": "constexpr"})
        consts.update({"STAGES": stages or narrow.STAGES})
    if ints_equal_one:
        sig.update({"stride_page_b": "constexpr", "max_pages": "constexpr"})
        consts.update({"stride_page_b": 1, "max_pages": 1})
    # As a launch specialises them: pointers 16-byte aligned, q's strides multiples of 16 elements
    # (which the launchers require of q).
    src = GluonASTSource(kernel, sig, consts, _launch_attrs(kernel, sig))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def waits_before_global_access(ptx: str) -> bool:
    """Whether the PTX waits for the previous kernel (griddepcontrol.wait)
    before its first global load, store or copy: the condition for launching
    it with programmatic dependent launch (triton_kernels.helpers.after_previous_kernel)."""
    wait = ptx.find("griddepcontrol.wait")
    accesses = [i for i in (ptx.find(op) for op in ("ld.global", "st.global", "cp.async", "atom.global")) if i >= 0]
    return wait >= 0 and all(wait < i for i in accesses)


def q_staging_barriers(ptx: str) -> int | None:
    """Barriers between the first and the last of q's 16-byte global loads:
    an e4m3 program's q staging (gluon_kernels.helpers.stage_q_fp16), where each barrier
    makes the loads after it wait a memory round trip. None where q is
    copied instead (16-bit caches: no such loads)."""
    lines = ptx.splitlines()
    loads = [i for i, line in enumerate(lines) if "ld.global.v4" in line]
    if not loads:
        return None
    return sum(1 for line in lines[loads[0]:loads[-1]] if "bar.sync" in line or "barrier.sync" in line)


def q_copies_before_kv_copies(ptx: str) -> bool | None:
    """Whether q's first cp.async precedes the first TMA copy of KV (None
    where q is not copied: an e4m3 cache's q is converted through registers)."""
    q_copy = ptx.find("cp.async.cg.shared.global")
    kv_copy = ptx.find("cp.async.bulk.tensor")
    return None if q_copy < 0 else 0 <= q_copy < kv_copy


def build_sm90(kernel, sig: dict, consts: dict, options: dict):
    """Triton kernel ``kernel`` built for sm_90 with its arguments' types ``sig`` (the constants
    marked ``constexpr``), the constants' values and the compile options, specialised as a launch
    specialises it (:func:`_launch_attrs`)."""
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(kernel, sig, consts, _launch_attrs(kernel, sig)),
                          target=GPUTarget("cuda", 90, 32), options=options)


# The Triton attention kernels' arguments but the cache's (a pointer or two descriptors).
_ATTENTION_ARGS = {"q_ptr": "*bf16", "kv_scale_ptr": "*fp32", "row_lens_ptr": "*i32", "page_table_ptr": "*i32",
                   "work_ptr": "*i32", "seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32", "seg_sum_ptr": "*fp32",
                   "out_ptr": "*bf16", "lse_ptr": "*fp32", "stride_q_row": "i32", "stride_q_head": "i32",
                   "stride_page_b": "i32", "softmax_scale_log2": "fp32", "max_pages": "i32"}


def compile_fp8_products_attention(dl: int, dr: int, dl_pad: int | None = None, descriptors: bool = False):
    """The Triton attention kernel of the fp8-products mode (e4m3 cache) for sm_90 at latent width
    ``dl`` and rope width ``dr``, its tl.dot widths padded as the launcher pads them (``dl_pad``
    overrides the latent one; ``descriptors``: the descriptor kernel, whose latent halves are not
    padded). Raises Triton's CompilationError where the build fails."""

    from mla_dcp.ops import launchers
    from mla_dcp.ops.triton_kernels import kernels
    consts = {"QLEN": 2, "H": 8, "DL": dl, "DR": dr, "PAGE": 64, "HAS_KV_SCALE": True, "Q_TO_FP16": False,
              "FINALIZE": False, "BLOCK_M": 16, "BLOCK_N": 64, "FP8_PRODUCTS": True, "WORK_COLS": 3, "PDL": True}
    if descriptors:
        kernel = kernels.segmented_attention_tma_kernel
        sig = {**_ATTENTION_ARGS, "kv_lo_desc": f"tensordesc<fp8e4nv[64, {dl // 2}]>",
               "kv_rope_desc": f"tensordesc<fp8e4nv[64, {dr}]>"}
        consts.update(NUM_STAGES=2, WARP_SPECIALIZE=False)
    else:
        kernel = kernels.segmented_attention_kernel
        sig = {**_ATTENTION_ARGS, "kv_ptr": "*fp8e4nv", "stride_kv_slot": "i32"}
        consts.update(DL_PAD=dl_pad or launchers._dot_width(dl, launchers._FP8_DOT_LEAST),
                      DR_PAD=launchers._dot_width(dr), DOT_PRECISION="tf32")
    sig = {**sig, **{c: "constexpr" for c in consts}}
    return build_sm90(kernel, sig, consts, {"num_warps": 4})


def compile_triton_kernels(ints_equal_one: bool = False):
    """Every Triton kernel a verify step can launch (row lengths, page
    expansion, the attention kernels off the Gluon path, both merges, the
    ragged blocks' moves, the cache write, masked blocks, sparse rows), for
    sm_90 with PDL on: {name: compiled}. ``ints_equal_one`` builds them as a
    launch does when every integer argument is 1: Triton then passes it as a
    constant, so a kernel that treats it as a tensor fails to build."""

    from mla_dcp.ops import launchers
    from mla_dcp.ops.triton_kernels import kernels
    attention = {"QLEN": 3, "H": 128, "DL": 512, "DR": 64, "PAGE": 64, "HAS_KV_SCALE": False, "Q_TO_FP16": False,
                 "FINALIZE": False, "BLOCK_M": 64, "BLOCK_N": 64, "FP8_PRODUCTS": False}
    fp8_products = {**attention, "HAS_KV_SCALE": True, "FP8_PRODUCTS": True}
    attention_args = _ATTENTION_ARGS
    block_args = {"q_ptr": "*bf16", "cache_ptr": "*bf16", "scale_ptr": "*fp32", "ctx_out_ptr": "*bf16",
                  "ctx_lse_ptr": "*fp32", "table_ptr": "*i32", "mask_ptr": "*i1", "seq_lens_ptr": "*i32",
                  "out_ptr": "*bf16", "lse_ptr": "*fp32",
                  **{name: "i32" for name in ("stride_q_row", "stride_q_head", "stride_slot", "stride_co_row",
                                              "stride_co_head", "stride_cl_row", "stride_table", "stride_mb",
                                              "stride_mt", "stride_mj", "heads", "table_cols", "qlen",
                                              "max_model_len")},
                  "scale2": "fp32"}
    block_consts = {"WORLD": 2, "RANK": 1, "INTERLEAVE": 1, "BLOCK_SIZE": 64, "DL": 512, "DL_PAD": 512, "DR": 64,
                    "DR_PAD": 64, "BLOCK_H": 8, "HAS_SCALE": False}
    sparse_args = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "kv_scale_ptr": "*fp32", "row_lens_ptr": "*i32",
                   "slots_ptr": "*i32", "counts_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
                   "seg_sum_ptr": "*fp32",
                   **{name: "i32" for name in ("stride_q_row", "stride_q_head", "stride_kv_slot", "heads", "topk",
                                               "qlen", "max_pages")},
                   "softmax_scale_log2": "fp32"}
    sparse_consts = {"PAGE": 64, "DL": 512, "DR": 64, "DL_PAD": 512, "DR_PAD": 64, "BLOCK_H": 16, "BLOCK_N": 32,
                     "HAS_KV_SCALE": False, "DOT_PRECISION": "tf32"}
    sparse_pieces = {**sparse_args, "out_ptr": "*fp32"}
    cases = {
        "row_lens": (kernels.row_lens_kernel, {"seq_lens_ptr": "*i32", "row_lens_ptr": "*i32", "num_rows": "i32"},
                     {"QLEN": 3, "WORLD": 2, "RANK": 1, "INTERLEAVE": 1, "BLOCK": 256, "CAUSAL": True}),
        "expand_pages": (kernels.expand_pages_kernel, {"block_table_ptr": "*i32", "page_table_ptr": "*i32",
                                                       "stride_block_b": "i32", "stride_page_b": "i32",
                                                       "max_pages": "i32"}, {"PAGES_PER_BLOCK": 4, "BLOCK": 256}),
        "attention_pointer": (kernels.segmented_attention_kernel,
                              {**attention_args, "kv_ptr": "*bf16", "stride_kv_slot": "i32"},
                              {**attention, "DL_PAD": 512, "DR_PAD": 64, "DOT_PRECISION": "tf32"}),
        "attention_tma": (kernels.segmented_attention_tma_kernel,
                          {**attention_args, "kv_lo_desc": "tensordesc<bf16[64, 256]>",
                           "kv_rope_desc": "tensordesc<bf16[64, 64]>"},
                          {**attention, "NUM_STAGES": 2, "WARP_SPECIALIZE": False}),
        "attention_tma_ws": (kernels.segmented_attention_tma_kernel,
                             {**attention_args, "kv_lo_desc": "tensordesc<bf16[64, 256]>",
                              "kv_rope_desc": "tensordesc<bf16[64, 64]>"},
                             {**attention, "NUM_STAGES": 2, "WARP_SPECIALIZE": True}),
        # VerifyConfig.fp8_products: e4m3 operands for the latent scores and P @ V.
        "attention_pointer_fp8_products": (kernels.segmented_attention_kernel,
                                           {**attention_args, "kv_ptr": "*fp8e4nv", "stride_kv_slot": "i32"},
                                           {**fp8_products, "DL_PAD": 512, "DR_PAD": 64, "DOT_PRECISION": "tf32"}),
        "attention_tma_fp8_products": (kernels.segmented_attention_tma_kernel,
                                       {**attention_args, "kv_lo_desc": "tensordesc<fp8e4nv[64, 256]>",
                                        "kv_rope_desc": "tensordesc<fp8e4nv[64, 64]>"},
                                       {**fp8_products, "NUM_STAGES": 2, "WARP_SPECIALIZE": False}),
        "merge_segments": (kernels.merge_segments_kernel, {"seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32",
                                                           "seg_sum_ptr": "*fp32", "segments_ptr": "*i32",
                                                           "out_ptr": "*bf16", "lse_ptr": "*fp32"},
                           {"QLEN": 3, "H": 128, "DL": 512, "BLOCK_D": 512, "CHUNK": 16}),
        "merge_pieces": (kernels.merge_segments_kernel, {"seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32",
                                                         "seg_sum_ptr": "*fp32", "segments_ptr": "*fp32",
                                                         "out_ptr": "*bf16", "lse_ptr": "*fp32"},
                         {"QLEN": 2, "H": 16, "DL": 512, "BLOCK_D": 32, "CHUNK": 8, "PIECES": 8}),
        "schedule": (kernels.schedule_kernel, {"row_lens_ptr": "*i32", "work_ptr": "*i32", "segments_ptr": "*i32",
                                               "batch": "i32", "num_items": "i32", "max_pages": "i32",
                                               "fixed_chunk": "i32"},
                     {"QLEN": 3, "PAGE": 64, "BLOCK_B": 32, "ITEMS_STEP": 16}),
        "step_metadata": (kernels.step_metadata_kernel, {"seq_lens_ptr": "*i32", "row_lens_ptr": "*i32",
                                                         "work_ptr": "*i32", "segments_ptr": "*i32", "batch": "i32",
                                                         "num_items": "i32", "max_pages": "i32",
                                                         "fixed_chunk": "i32"},
                          {"QLEN": 3, "WORLD": 8, "RANK": 1, "INTERLEAVE": 1, "CAUSAL": True, "PAGE": 64,
                           "BLOCK": 256, "BLOCK_B": 32, "ITEMS_STEP": 16}),
        # Ragged blocks: packed tokens to verify rows and back.
        "ragged_map": (kernels.ragged_map_kernel, {"starts_ptr": "*i32", "token_of_row_ptr": "*i32",
                                                   "row_of_token_ptr": "*i32", "batch": "i32", "num_tokens": "i32"},
                       {"QLEN": 3, "QLEN_PAD": 4, "NO_ROW": -2, "NO_REQUEST": -1, "BLOCK": 128}),
        "ragged_rows": (kernels.ragged_rows_kernel, {"q_ptr": "*bf16", "token_of_row_ptr": "*i32", "rows_ptr": "*bf16",
                                                     "stride_q": "i32", "width": "i32"}, {"BLOCK": 1024}),
        "ragged_tokens": (kernels.ragged_tokens_kernel, {"out_ptr": "*bf16", "lse_ptr": "*fp32",
                                                         "row_of_token_ptr": "*i32", "token_out_ptr": "*bf16",
                                                         "token_lse_ptr": "*fp32", "stride_out": "i32",
                                                         "stride_lse": "i32", "width": "i32", "lse_width": "i32"},
                          {"NO_ROW": -2, "BLOCK": 1024, "LSE_BLOCK": 16}),
        # The step's new tokens into a rank's cache (bf16, and e4m3 through its scale).
        "write_cache": (kernels.write_cache_kernel, {"cache_ptr": "*bf16", "slots_ptr": "*i64", "latent_ptr": "*bf16",
                                                     "scale_ptr": "*i64", "stride_slot": "i32",
                                                     "stride_latent": "i32", "width": "i32"},
                        {"LIMIT": 0.0, "HAS_SCALE": False, "BLOCK": 1024}),
        "write_cache_fp8": (kernels.write_cache_kernel, {"cache_ptr": "*fp8e4nv", "slots_ptr": "*i64",
                                                         "latent_ptr": "*fp32", "scale_ptr": "*fp32",
                                                         "stride_slot": "i32", "stride_latent": "i32",
                                                         "width": "i32"},
                            {"LIMIT": 448.0, "HAS_SCALE": True, "BLOCK": 1024}),
        # Masked blocks (token trees): each row's block keys, merged into its context partial.
        "block_attention": (kernels.block_attention_kernel, block_args, block_consts),
        "block_attention_fp8": (kernels.block_attention_kernel, {**block_args, "cache_ptr": "*fp8e4nv"},
                                {**block_consts, "HAS_SCALE": True}),
        # Token-sparse rows (DeepSeek Sparse Attention): the listed positions gathered a tile at a time.
        "sparse_slots": (kernels.sparse_slots_kernel, {"indices_ptr": "*i32", "row_lens_ptr": "*i32",
                                                       "page_table_ptr": "*i32", "slots_ptr": "*i32",
                                                       "counts_ptr": "*i32", "stride_idx_row": "i32",
                                                       "stride_page_b": "i32", "topk": "i32", "qlen": "i32",
                                                       "max_pages": "i32"},
                         {"WORLD": 8, "RANK": 1, "INTERLEAVE": 1, "PAGE": 64, "BLOCK": 256}),
        "sparse_attention": (kernels.sparse_attention_kernel, sparse_args, sparse_consts),
        # Several pieces a row: partials for merge_segments_kernel.
        "sparse_attention_pieces": (kernels.sparse_attention_kernel, sparse_pieces,
                                    {**sparse_consts, "PIECES": 8, "FINALIZE": False}),
        "sparse_attention_fp8": (kernels.sparse_attention_kernel, {**sparse_args, "kv_ptr": "*fp8e4nv"},
                                 {**sparse_consts, "HAS_KV_SCALE": True}),
        "sparse_attention_h32": (kernels.sparse_attention_kernel, sparse_args,
                                 {**sparse_consts, "BLOCK_H": 32, "BLOCK_N": 16}),
        # DeepSeek's fp8 layout (uint8 rows: e4m3 latent, a float32 scale per 128 values, bf16 rope).
        "sparse_attention_ds": (kernels.sparse_attention_kernel, {**sparse_args, "kv_ptr": "*u8"},
                                {**sparse_consts, "DS_LAYOUT": True, "BLOCK_N": 16}),
        "write_cache_ds": (kernels.write_cache_ds_kernel, {"cache_ptr": "*u8", "slots_ptr": "*i64",
                                                           "latent_ptr": "*bf16", "stride_slot": "i32",
                                                           "stride_latent": "i32"},
                           {"DL": 512, "DR": 64, "DR_PAD": 64}),
        "merge_ranks": (kernels.merge_ranks_kernel, {"outs_ptr": "*bf16", "lses_ptr": "*fp32", "out_ptr": "*bf16",
                                                     "lse_ptr": "*fp32", "pairs": "i32"},
                        {"WORLD": 2, "W_PAD": 2, "DL": 512, "DL_PAD": 512}),
    }
    # The stream schedule (5 work columns): programs run several pieces, in both attention kernels.
    for name in ("attention_pointer", "attention_tma"):
        kernel, sig, consts = cases[name]
        cases[name + "_stream"] = (kernel, sig, {**consts, "WORK_COLS": 5})
    for name in ("schedule", "step_metadata"):
        cases[name][1]["programs"] = "i32"
        cases[name + "_stream"] = (cases[name][0], cases[name][1], {**cases[name][2], "STREAM": True})
    compiled = {}
    for name, (kernel, sig, consts) in cases.items():
        consts = {**consts, "PDL": True}
        # A launch's defaults: the kernel's own, and those its launchers pass where the kernel has none.
        for constant, value in {"WORK_COLS": 3, "STREAM": False}.items():
            if constant in kernel.arg_names:
                consts.setdefault(constant, value)
        for param in inspect.signature(kernel.fn).parameters.values():
            if param.default is not inspect.Parameter.empty:
                consts.setdefault(param.name, param.default)
        if ints_equal_one:
            consts.update({arg: 1 for arg, kind in sig.items() if kind == "i32"})
        sig = {**sig, **{c: "constexpr" for c in consts}}
        warps = 8 if name.startswith(("attention", "block_attention", "sparse_attention")) else 4
        options = {"num_warps": warps}
        if name.startswith("sparse_attention"):
            tile = launchers.SPARSE_TILES["ds" if consts.get("DS_LAYOUT") else consts["BLOCK_H"]]
            options = {"num_warps": tile[2], "num_stages": tile[3]}
        compiled[name] = build_sm90(kernel, sig, consts, options)
    return compiled


def compile_step_metadata(batch: int, stream: bool, max_pages: int = 4096):
    """The fused metadata kernel (stage 1 and the schedule) for sm_90 as a
    step of ``batch`` requests launches it: the launcher's block, step and
    warp count for that batch, the stream's or the chunked schedule's."""
    from mla_dcp.ops import launchers
    from mla_dcp.ops.triton_kernels import kernels

    consts = launchers._schedule_constants(batch, max_pages, 1 if stream else 0)
    warps = consts.pop("num_warps")
    consts.update({"QLEN": 3, "WORLD": 8, "RANK": 1, "INTERLEAVE": 1, "CAUSAL": True, "PAGE": 64, "BLOCK": 256,
                   "PDL": True})
    consts.setdefault("STREAM", False)   # the launch leaves the chunked build's default
    consts["CONTEXT"] = False            # a masked view's context: the same build but for one subtraction
    sig = {"seq_lens_ptr": "*i32", "row_lens_ptr": "*i32", "work_ptr": "*i32", "segments_ptr": "*i32",
           "batch": "i32", "num_items": "i32", "max_pages": "i32", "fixed_chunk": "i32", "programs": "i32",
           **{c: "constexpr" for c in consts}}
    return build_sm90(kernels.step_metadata_kernel, sig, consts, {"num_warps": warps})


def compile_merge(block_d: int, warps: int, chunk: int, qlen: int = 4, heads: int = 16, width: int = 512):
    """The segment merge kernel for sm_90 at one tile: ``block_d`` columns a program, ``warps``,
    ``chunk`` items a step."""
    from mla_dcp.ops.triton_kernels import kernels

    consts = {"QLEN": qlen, "H": heads, "DL": width, "BLOCK_D": block_d, "CHUNK": chunk, "PDL": True, "PIECES": 0}
    sig = {"seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32", "seg_sum_ptr": "*fp32", "segments_ptr": "*i32",
           "out_ptr": "*bf16", "lse_ptr": "*fp32", **{c: "constexpr" for c in consts}}
    return build_sm90(kernels.merge_segments_kernel, sig, consts, {"num_warps": warps})


def ptx_fingerprint(ptx: str) -> str:
    """A digest of the PTX without its debug information (line and file
    directives, comments, debug sections): equal before and after a change
    that only moves or renames code, so a refactor can show it changed no
    instruction (compare the ``ptx`` fields of two ``--json`` runs)."""
    cut = min((i for i in (ptx.find(".section\t.debug"), ptx.find(".section .debug")) if i >= 0), default=len(ptx))
    lines = [re.sub(r"\s*//.*$", "", line) for line in ptx[:cut].splitlines()
             if not re.match(r"\s*(\.loc|\.file|//|\$L__)", line)]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16]


def resources(kernel) -> str:
    tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    # cuobjdump's SHARED is the static shared memory; what a launch asks for (the pipeline's
    # buffers, layout conversions) is the kernel's dynamic shared memory, DYNAMIC_SHARED.
    found = re.findall(r"REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+", text)
    return " ".join(found + [f"DYNAMIC_SHARED:{getattr(kernel.metadata, 'shared', 0)}"])


if __name__ == "__main__":
    # `--json`: one line per variant for tests/test_seesaw.py (which runs this
    # without TRITON_INTERPRET: under it every jit function is interpreted).
    as_json = "--json" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--json"]
    out = pathlib.Path(args[0]) if args else None
    # (block_m, finalize, page, qlen, heads, kv, stages, products: the seesaw's fp8-products build)
    variants = [(64, False, 64, 3, 128, None, None, False), (64, True, 64, 3, 128, None, None, False),
                (64, True, 16, 3, 128, None, None, False), (32, False, 64, 2, 16, None, None, False),
                (32, True, 16, 2, 16, None, None, False), (16, False, 64, 2, 16, None, None, False),
                (32, False, 64, 3, 128, "fp8e4nv", None, False), (32, False, 64, 2, 16, None, 1, False),
                (64, False, 64, 3, 128, "fp8e4nv", None, False), (64, True, 16, 3, 128, "fp8e4nv", None, False),
                (64, False, 64, 3, 128, "fp8e4nv", None, True), (64, True, 16, 3, 128, "fp8e4nv", None, True)]
    for block_m, finalize, page, qlen, heads, kv, stages, products in variants:
        k = compile_variant(finalize, page=page, block_m=block_m, qlen=qlen, heads=heads, kv=kv, stages=stages,
                            fp8_products=products)
        ptx = k.asm["ptx"]
        name = ("seesaw" if block_m == 64 else f"narrow{block_m}") + ("-fp8" if kv else "") + (
            f"-s{stages}" if stages else "") + ("p" if products else "")
        if as_json:
            print(json.dumps({"kernel": name, "finalize": finalize, "page": page, "shared": k.metadata.shared,
                              "wgmma": ptx.count("wgmma.mma_async"), "setmaxnreg": ptx.count("setmaxnreg"),
                              "griddepcontrol": ptx.count("griddepcontrol."),
                              "waits_first": waits_before_global_access(ptx),
                              "q_copies_first": q_copies_before_kv_copies(ptx),
                              "q_staging_barriers": q_staging_barriers(ptx),
                              "float_divisions": len(re.findall(r"\bdiv\.(?:full|rn|approx)\.f32", ptx)),
                              "stmatrix": ptx.count("stmatrix."),
                              "local": resources(k), "ptx": ptx_fingerprint(ptx)}))
        else:
            print(f"{name} FINALIZE={finalize} page={page}: {resources(k)} dyn_shared={k.metadata.shared} "
                  f"wgmma={ptx.count('wgmma.mma_async')} setmaxnreg={ptx.count('setmaxnreg')}")
        if out:
            out.mkdir(parents=True, exist_ok=True)
            stem = f"{name}_f{int(finalize)}_p{page}"
            (out / f"{stem}.ptx").write_text(ptx)
            (out / f"{stem}.ttgir").write_text(k.asm["ttgir"])
    for name, k in compile_triton_kernels().items():
        ptx = k.asm["ptx"]
        if as_json:
            print(json.dumps({"triton_kernel": name, "griddepcontrol": ptx.count("griddepcontrol."),
                              "waits_first": waits_before_global_access(ptx), "local": resources(k),
                              "ptx": ptx_fingerprint(ptx)}))
        else:
            print(f"{name}: griddepcontrol={ptx.count('griddepcontrol.')} "
                  f"waits first={waits_before_global_access(ptx)}")
