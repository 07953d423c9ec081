"""What a Gluon kernel's loop is made of: copies with one stage removed, timed beside the committed kernel.

    python benchmarks/probes/stage_variants.py OUT_DIR [C1,C6,C4@narrow] [no_qk,no_pv,no_softmax,loads_only]

Specs as in benchmarks/probes/seesaw_timeline.py (``NAME[:N][@KERNEL]``; an e4m3 config such as C2 on ``@narrow``).
Each variant is a copy of ops/gluon_kernels/seesaw.py or ops/gluon_kernels/narrow.py, built by text
substitution with every anchor checked (tests/test_seesaw.py builds them on
the CPU, so a kernel edit that moves an anchor fails there):

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
from mla_dcp.ops.gluon_kernels import narrow, seesaw

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import seesaw_timeline  # noqa: E402

# The seesaw keeps the rope part's product (1/9 of the score flops): with no
# wgmma left in the score step its copy hangs on the GPU (a recorded H200 run: compiled,
# never returned), so its no_qk times the latent halves' products.
SEESAW_NO_QK = [
    ("    s = warpgroup_mma(q_own, k_own.permute((1, 0)), s, use_acc=False, is_async=True)\n", ""),
    ("    s = warpgroup_mma(q_other, k_other.permute((1, 0)), s, is_async=True)\n", ""),
    ("    s = warpgroup_mma(q_rope_regs, k_rope.permute((1, 0)), s, is_async=True)\n",
     "    s = warpgroup_mma(q_rope_regs, k_rope.permute((1, 0)), s, use_acc=False, is_async=True)\n"),
]
SEESAW_NO_PV = [
    ("        acc = warpgroup_mma(gl.convert_layout(p16, pa_layout), _rebuilt_each_pair(v_half.index(my), k), acc,\n"
     "                            is_async=True)\n", ""),
    ("            acc = warpgroup_mma(_rebuilt_each_pair(p1_smem, k), _rebuilt_each_pair(kv_lo.index(1), k), acc,\n"
     "                                is_async=True)\n", ""),
    ("            acc = warpgroup_mma(_rebuilt_each_pair(p0_smem, k), _rebuilt_each_pair(kv_hi.index(0), k), acc,\n"
     "                                is_async=True)\n", ""),
]
# e4m3 caches: each landed part stays as it landed (its fp16 buffer's values are garbage).
SEESAW_NO_CONVERT = [("            _convert_in_place(buf, helpers.landing(buf, desc))\n", "            pass\n")]
# One conversion site each: the part is waited for as before, but taken as already converted.
SEESAW_NO_CONVERT_AHEAD = [("            _landed(buf, bar, phase, desc, False)\n",
                            "            _landed(buf, bar, phase, desc, True)\n")]
SEESAW_NO_CONVERT_OTHER = [("    _landed(k_other, bar_other, phase, half_desc, False)\n",
                            "    _landed(k_other, bar_other, phase, half_desc, True)\n")]
SEESAW_NO_CONVERT_ROPE = [("    _landed(k_rope, bar_rope, phase, rope_desc, False)\n",
                           "    _landed(k_rope, bar_rope, phase, rope_desc, True)\n")]
SEESAW_NO_SOFTMAX = [("            p = gl.exp2(s - m_shift[:, None])\n", "            p = s - m_shift[:, None]\n", 2)]

NARROW_NO_QK = [
    ("        s = _add_scores(k_lo, q_lo, s, a_layout, FP8, False)\n", ""),
    ("        s = _add_scores(k_hi, q_hi, s, a_layout, FP8, True)\n", ""),
    ("        s = _add_scores(kv_rope.index(stage), q_rope, s, a_layout, FP8, True)\n",
     "        s = kv_rope.index(stage).slice(0, BLOCK_M, dim=1).load(mma_layout).to(gl.float32)\n"),
]
NARROW_NO_PV = [
    ("            acc_lo = warpgroup_mma(k_lo.permute((1, 0)), p_smem, acc_lo * alpha[None, :], is_async=True)\n"
     "            acc_hi = warpgroup_mma(k_hi.permute((1, 0)), p_smem, acc_hi * alpha[None, :], is_async=True)\n"
     "            acc_lo, acc_hi = warpgroup_mma_wait(0, deps=(acc_lo, acc_hi))\n",
     "            acc_lo = acc_lo * alpha[None, :]\n            acc_hi = acc_hi * alpha[None, :]\n"),
    # The e4m3 branch (conversions in registers) is a separate anchor: a recorded H200 run missed it (no_pv = committed on C2).
    ("            acc_lo = _values_from_registers(k_lo, p_smem, acc_lo * alpha[None, :], a_layout)\n"
     "            acc_hi = _values_from_registers(k_hi, p_smem, acc_hi * alpha[None, :], a_layout)\n",
     "            acc_lo = acc_lo * alpha[None, :]\n            acc_hi = acc_hi * alpha[None, :]\n"),
]
NARROW_NO_SOFTMAX = [("        p = gl.exp2(s - m_shift[None, :])\n", "        p = s - m_shift[None, :]\n")]

VARIANTS = {
    "seesaw": {"no_qk": SEESAW_NO_QK, "no_pv": SEESAW_NO_PV, "no_softmax": SEESAW_NO_SOFTMAX,
               "no_convert": SEESAW_NO_CONVERT, "no_convert_ahead": SEESAW_NO_CONVERT_AHEAD,
               "no_convert_other": SEESAW_NO_CONVERT_OTHER, "no_convert_rope": SEESAW_NO_CONVERT_ROPE, "copy": [],
               "loads_only": SEESAW_NO_QK + SEESAW_NO_PV + SEESAW_NO_SOFTMAX},
    "narrow": {"no_qk": NARROW_NO_QK, "no_pv": NARROW_NO_PV, "no_softmax": NARROW_NO_SOFTMAX,
               "loads_only": NARROW_NO_QK + NARROW_NO_PV + NARROW_NO_SOFTMAX, "copy": []},
}
MODULES = {"seesaw": seesaw, "narrow": narrow}


def module_copy(path: pathlib.Path, module, edits, suffix: str = ""):
    """Import a copy of ``module``'s source with ``edits`` applied, written to
    ``path``: (old, new) pairs, each ``old`` occurring once, or (old, new, n)
    where it occurs n times (all replaced). An anchor that moved fails here."""
    text = pathlib.Path(module.__file__).read_text()
    for old, new, *count in edits:
        expected = count[0] if count else 1
        assert text.count(old) == expected, f"anchor occurs {text.count(old)} times, not {expected}: {old!r}"
        text = text.replace(old, new)
    path.write_text(text + suffix)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def variant_module(out_dir: pathlib.Path, kind: str, variant: str):
    return module_copy(out_dir / f"{kind}_{variant}.py", MODULES[kind], VARIANTS[kind][variant])


def main():
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
