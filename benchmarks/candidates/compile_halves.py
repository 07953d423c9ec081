"""Compile benchmarks/candidates/halves.py for sm_90 without a GPU; print its resources.

    python benchmarks/candidates/compile_halves.py [OUT_DIR]     # Triton 3.6 with Gluon, no TRITON_INTERPRET
"""
import importlib.util
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "scripts")]
import gluon_compile  # noqa: E402

spec = importlib.util.spec_from_file_location("halves", pathlib.Path(__file__).with_name("halves.py"))
halves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(halves)
out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
# As its launch picks: e4m3 caches at its STAGES, 16-bit ones (the probe's edge checks) at one.
for kv, finalize, page, stages in (("fp8e4nv", False, 64, halves.STAGES), ("fp8e4nv", True, 16, halves.STAGES),
                                   (None, False, 64, 1)):
    k = gluon_compile.compile_variant(finalize, page=page, block_m=64, kv=kv, stages=stages,
                                      kernel=halves.halves_attention_kernel, narrow_args=True)
    name = f"halves-{kv or 'bf16'}_f{int(finalize)}_p{page}"
    ptx = k.asm["ptx"]
    print(name, gluon_compile.resources(k), f"dyn_shared={k.metadata.shared}", f"wgmma={ptx.count('wgmma.mma_async')}",
          f"setmaxnreg={ptx.count('setmaxnreg')}", flush=True)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.ptx").write_text(ptx)
        import subprocess
        import tempfile

        import triton
        tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
        (out / f"{name}.sass").write_text(sass)
