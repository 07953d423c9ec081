"""What a Gluon kernel's loop is made of: copies with one stage removed, timed beside the committed kernel.

    python benchmarks/probes/stage_variants.py OUT_DIR [C1,C6,C4@narrow] [no_qk,no_pv,no_softmax,loads_only]

Specs as in benchmarks/probes/seesaw_timeline.py (``NAME[:N][@KERNEL]``; an e4m3 config such as C2 on ``@narrow``).
Each variant is a copy of ops/gluon_kernels/seesaw.py or ops/gluon_kernels/narrow.py in which the
statement after a named marker (``# probe: qk-own`` and the others) is replaced, each marker's
count checked (tests/test_seesaw.py builds every copy on the CPU):

* ``no_qk``: the score products replaced by a read of the tile's rope part
  from shared memory (scores must still vary per element: the compiler
  would fold the softmax of a constant tile); in the seesaw, the latent
  halves' products only (the rope part's stays: see SEESAW_NO_QK);
* ``no_pv``: the V products removed (and with them the accumulator's
  rescaling, which then folds away);
* ``no_softmax``: each exp2 of the probabilities replaced by the
  subtraction it exponentiates (the row max and sum stay);
* ``loads_only``: all three: the KV stream, the waits and the epilogue;
* ``no_convert`` (seesaw, e4m3 caches): the in-place conversions removed;
  ``no_convert_ahead``, ``no_convert_other``, ``no_convert_rope``: one site
  of them each (the own latent half, converted ahead under the last V
  product; the other half, and the rope part, converted in the scores), to
  see which one's chain is exposed;
* ``no_wait_own``, ``no_wait_other`` (seesaw, 16-bit caches): the scores no longer wait for
  the warpgroup's own latent half, or the other half, to land: the copies' latency the loop
  exposes (without any part's wait, rope too, a program can end with copies in flight: the
  launch fails);
* ``products`` kind (``C2@products``: the seesaw's fp8-products build):
  ``no_transpose`` (V^T never written), ``no_rope`` (the scores skip the
  rope part's conversion, product and the wait after it);
* ``copy``: no edit, the committed kernel loaded from a copy as the variants
  are. The probes have read a variant file 1-3% faster than the committed
  module with the same code: time variants against this one.

Their outputs are wrong by design; only time matters, and each variant's
register allocation differs from the committed kernel's (no_qk leaves the
seesaw without spills: read its time as an upper bound on what the stage
costs). Each config's first
input runs under a CUDA graph (attention kernel alone, the config's tuned
segment count), committed kernel and variants in two turns. Writes
OUT_DIR/stage_variants.json.
"""
import importlib.util
import json
import pathlib
import sys
import time

from mla_dcp import bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import seesaw_timeline  # noqa: E402

# Each edit: (marker, replacement[, count]): the statement after each
# ``# probe: <marker>`` comment line of the kernel's module (``count`` of
# them, default 1) becomes ``replacement`` ("" removes it).
#
# The seesaw keeps the rope part's product (1/9 of the score flops): with no
# wgmma left in the score step its copy hangs on the GPU (a recorded H200 run: compiled,
# never returned), so its no_qk times the latent halves' products. On C1 that copy hung
# too (H200, Triton 3.6): run it alone, under a timeout.
SEESAW_NO_QK = [
    ("qk-own", ""),
    ("qk-other", ""),
    ("qk-rope", "s = warpgroup_mma(q_rope_regs, k_rope.permute((1, 0)), s, use_acc=False, is_async=True)"),
]
SEESAW_NO_PV = [("pv-own", ""), ("pv-other", "", 2)]
# e4m3 caches: each landed part stays as it landed (its fp16 buffer's values are garbage).
SEESAW_NO_CONVERT = [("convert", "pass")]
# One conversion site each: the part is waited for as before, but taken as already converted.
SEESAW_NO_CONVERT_AHEAD = [("convert-ahead", "_landed(buf, bar, phase, desc, True)")]
SEESAW_NO_CONVERT_OTHER = [("convert-other", "_landed(k_other, bar_other, phase, half_desc, True)")]
SEESAW_NO_CONVERT_ROPE = [("convert-rope", "_landed(k_rope, bar_rope, phase, rope_desc, True)")]
SEESAW_NO_SOFTMAX = [("softmax", "p = s - m_shift[:, None]", 2)]
# 16-bit caches: a part's copy no longer waited for in the scores (the product reads whatever the
# buffer holds), to see how much of each copy's latency the loop exposes.
SEESAW_NO_WAIT_OWN = [("wait-own", "")]
SEESAW_NO_WAIT_OTHER = [("convert-other", "")]

# The fp8-products build (kind "products"): V^T never stored (its loads then fold away), or the
# scores without the rope part (its copy still waited for, not converted or multiplied).
PRODUCTS_NO_TRANSPOSE = [("vt-store", "")]
PRODUCTS_NO_ROPE = [("e4m3-convert-rope", "mbarrier.wait(bar_rope, phase)"), ("e4m3-qk-rope", ""),
                    ("e4m3-scores-wait", "return s")]

NARROW_NO_QK = [
    ("qk-lo", ""),
    ("qk-hi", ""),
    ("qk-rope", "s = kv_rope.index(stage).slice(0, BLOCK_M, dim=1).load(mma_layout).to(gl.float32)"),
]
# Both branches (16-bit and e4m3 tiles) carry the markers.
NARROW_NO_PV = [("pv-lo", "acc_lo = acc_lo * alpha[None, :]", 2), ("pv-hi", "acc_hi = acc_hi * alpha[None, :]", 2),
                ("pv-wait", "")]
NARROW_NO_SOFTMAX = [("softmax", "p = s - m_shift[None, :]")]

VARIANTS = {
    "seesaw": {"no_qk": SEESAW_NO_QK, "no_pv": SEESAW_NO_PV, "no_softmax": SEESAW_NO_SOFTMAX,
               "no_convert": SEESAW_NO_CONVERT, "no_convert_ahead": SEESAW_NO_CONVERT_AHEAD,
               "no_convert_other": SEESAW_NO_CONVERT_OTHER, "no_convert_rope": SEESAW_NO_CONVERT_ROPE, "copy": [],
               "no_wait_own": SEESAW_NO_WAIT_OWN, "no_wait_other": SEESAW_NO_WAIT_OTHER,
               "loads_only": SEESAW_NO_QK + SEESAW_NO_PV + SEESAW_NO_SOFTMAX},
    "products": {"no_transpose": PRODUCTS_NO_TRANSPOSE, "no_rope": PRODUCTS_NO_ROPE, "copy": []},
    "narrow": {"no_qk": NARROW_NO_QK, "no_pv": NARROW_NO_PV, "no_softmax": NARROW_NO_SOFTMAX,
               "loads_only": NARROW_NO_QK + NARROW_NO_PV + NARROW_NO_SOFTMAX, "copy": []},
}
MODULES = seesaw_timeline.MODULES


def _statement_end(lines: list[str], first: int) -> int:
    """Index after the statement that starts at ``lines[first]`` (brackets balanced)."""
    depth, i = 0, first
    while True:
        code = lines[i].split("#")[0]
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        i += 1
        if depth <= 0:
            return i


def module_copy(path: pathlib.Path, module, edits):
    """Import a copy of ``module``'s source with ``edits`` applied (see
    SEESAW_NO_QK), written to ``path``. A marker that occurs another number
    of times than the edit says fails here."""
    lines = pathlib.Path(module.__file__).read_text().split("\n")
    for marker, replacement, *count in edits:
        at = [i for i, line in enumerate(lines) if line.strip() == f"# probe: {marker}"]
        assert len(at) == (count[0] if count else 1), f"marker {marker!r} occurs {len(at)} times"
        for i in reversed(at):
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            end = _statement_end(lines, i + 1)
            lines[i + 1:end] = [indent + replacement] if replacement else []
    path.write_text("\n".join(lines))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def variant_module(out_dir: pathlib.Path, kind: str, variant: str):
    return module_copy(out_dir / f"{kind}_{variant}.py", MODULES[kind], VARIANTS[kind][variant])


def main():
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = (sys.argv[2] if len(sys.argv) > 2 else "C1,C6,C4@narrow").split(",")
    variants = (sys.argv[3] if len(sys.argv) > 3 else "no_qk,no_pv,no_softmax,loads_only").split(",")
    result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "configs": {}}
    for spec in specs:
        name, forced, kind, block_m = seesaw_timeline.parse_spec(spec)
        modules = {"committed": MODULES[kind], **{v: variant_module(out_dir, kind, v) for v in variants}}
        cfg, views, ns, finalize, outputs, page = seesaw_timeline.attention_case(name, forced)
        timings, resources = {}, {}
        for _turn in range(2):
            for label, module in modules.items():
                run = seesaw_timeline.launcher(module, kind, cfg, ns, outputs, finalize, page, block_m)
                # A removed stage also changes register allocation: keep what the compiler did.
                # A hung variant (a removed stage some wait depended on) shows as the last line printed.
                print(f"{time.strftime('%X')} {spec} turn {_turn} {label}: launching", flush=True)
                compiled = run(*views[0])
                resources[label] = {key: getattr(compiled, key, None) for key in ("n_regs", "n_spills")}
                fns = [lambda args=args, run=run: run(*args) for args in views]
                timings.setdefault(label, []).append(bench.time_fn(bench._rotating(bench._graphed(fns))) * 1e6)
                # Written after every timing: a later variant that hangs must not lose the earlier ones.
                result["configs"][spec] = {"segments": ns, "kernel": kind, "graph_us": timings, "resources": resources}
                (out_dir / "stage_variants.json").write_text(json.dumps(result, indent=1))
                print(f"  {label}: {timings[label][-1]:.1f} us", flush=True)
        print(spec, {k: [round(t, 1) for t in v] for k, v in timings.items()}, flush=True)


if __name__ == "__main__":
    main()
