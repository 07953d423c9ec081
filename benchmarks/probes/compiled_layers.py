"""Host time of a model's attention per decode step: one build_view and N
layers' verify calls sharing its view, eager, under
``torch.compile(fullgraph=True)`` without CUDA graphs, and as an AOTInductor
package (``torch.export`` then ``aoti_compile_and_package``: a C++ wrapper
calls the ops, with no Python guards or wrappers).

    python benchmarks/probes/compiled_layers.py OUT_DIR [C7,R1] [--layers 1,4,16,61]
    python benchmarks/probes/compiled_layers.py OUT_DIR --cpu    # every op's kernel its fake
    ... --no-aoti: eager and compiled only

A one-layer step pays a compiled graph's fixed cost (its guards and wrappers)
once for one op; a model pays it once a step for all of its layers. So the
per-layer slope, not the one-layer step, is what a compiled model adds for
each layer. Host us per step (``bench.host_time``: back-to-back calls, no
sync; on a GPU a step whose GPU time is longer reads as its GPU time) and the
slope between the first and last layer counts; written to
OUT_DIR/compiled_layers.json. ``--cpu``: C7's shapes on the CPU with every
mla_dcp op's kernel replaced by its fake (allocations only), so what is timed
is the API, the dispatcher and torch.compile's wrappers.
"""
import json
import pathlib
import sys
import time

import torch

import _ab
import mla_dcp


class Step(torch.nn.Module):
    """One build_view and ``layers`` verify calls sharing its view."""

    def __init__(self, cfg, layers):
        super().__init__()
        self.cfg, self.layers = cfg, layers

    def forward(self, seq_lens, table, q, kv, scale=None):
        view = mla_dcp.build_view(self.cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        return [mla_dcp.verify(self.cfg, view, q, kv, scale)[0] for _ in range(self.layers)]


def aoti_step(step, inputs):
    """The step exported and built by AOTInductor, loaded back: its C++ wrapper calls the ops."""
    import tempfile

    args = tuple(x for x in inputs if x is not None)
    exported = torch.export.export(step, args)
    path = torch._inductor.aoti_compile_and_package(exported, package_path=tempfile.mkdtemp() + "/step.pt2")
    runner = torch._inductor.aoti_load_package(path)
    return lambda: runner(*args)


def per_call(fn, calls):
    if torch.cuda.is_available():
        from mla_dcp import bench
        return bench.host_time(fn, calls)
    for _ in range(20):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def main():
    args = sys.argv[1:]
    out_dir = pathlib.Path(args.pop(0))
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = [1, 4, 16, 61]
    if "--layers" in args:
        at = args.index("--layers")
        layers = [int(n) for n in args[at + 1].split(",")]
        del args[at:at + 2]
    # A package's load segfaulted in torch 2.11's loader on the H200 machine: --no-aoti keeps the rest.
    modes = ("eager", "compiled") if "--no-aoti" in args else ("eager", "compiled", "aoti")
    args = [a for a in args if a != "--no-aoti"]
    if "--cpu" in args:
        args.remove("--cpu")
        _keep = _ab.cpu_fakes()
        cases = {"C7 (CPU, fakes)": (*_ab.cpu_c7_case(), None)}
    else:
        from mla_dcp import bench
        cases = {}
        for name in ",".join(args or ["C7"]).split(","):
            case = bench.make_case(name, torch.bfloat16)
            cases[name] = (case.cfg, *case.inputs[0])
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if torch.cuda.is_available()
              else "cpu", "configs": {}}
    with torch.inference_mode():
        for name, inputs in cases.items():
            rows = {}
            for n in layers:
                torch._dynamo.reset()       # each count traced afresh, its batch static
                module = Step(inputs[0], n)
                step = lambda module=module: module(*inputs[1:])          # noqa: E731
                calls = max(50, 2000 // n)
                eager = per_call(step, calls) * 1e6
                compiled_module = torch.compile(module, fullgraph=True)
                compiled = per_call(lambda: compiled_module(*inputs[1:]), calls) * 1e6
                rows[n] = {"eager_us": eager, "compiled_us": compiled}
                if "aoti" in modes:
                    rows[n]["aoti_us"] = per_call(aoti_step(module, inputs[1:]), calls) * 1e6
                print(f"{name} {n:3d} layers: eager {eager:8.1f} us, compiled {compiled:8.1f} us"
                      + (f", AOTInductor package {rows[n]['aoti_us']:8.1f} us" if "aoti" in modes else ""), flush=True)
            first, last = min(layers), max(layers)
            if last > first:
                for mode in modes:
                    slope = (rows[last][f"{mode}_us"] - rows[first][f"{mode}_us"]) / (last - first)
                    rows[f"{mode}_us_per_layer"] = slope
                    print(f"{name} {mode}: {slope:.1f} us a layer", flush=True)
            result["configs"][name] = rows
            (out_dir / "compiled_layers.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
