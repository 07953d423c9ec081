"""Where a native eager step's host time goes: the API calls against their native plans' C++
calls alone, the C++ allocations against at::empty in turns, and each Python gate alone.

    python benchmarks/probes/native_split.py OUT_DIR [C7 R1 ...] [--turns N] [--against M]

Each figure is ``bench.host_time`` (1,000 back-to-back calls, no synchronisation), the median over
N turns (default 6) where modes alternate: "with" allocates as the plans do by default (one block
for a call's outputs, from the recorded allocator; ``Plan.allocation`` 2), "without" as mode M
(``--against``: 1, one allocation an output from that allocator; 0, default, at::empty each). Rows: the
eager step, build_view and verify through the API, each plan's ``Sequence.run_native`` and its C++
``Plan.run`` alone; then (once) the gates the API checks before the C++ call, and one torch.empty.
Writes OUT_DIR/native_split_against_M.json.
"""
import json
import os
import sys

import torch

import _ab
from mla_dcp import _checks, api, bench
from mla_dcp.ops import fast_launch, library, native


def gates(q: torch.Tensor) -> dict:
    """Host us of each check the eager API makes before its native plan's C++ call."""
    device = q.device.index
    rows = {
        "api._native_first": lambda: api._native_first(False),
        "library.plain_eager_cuda": lambda: library.plain_eager_cuda(q),
        "library.launchers_may_serve": library.launchers_may_serve,
        "torch.compiler.is_compiling": torch.compiler.is_compiling,
        "_checks.check_requested": _checks.check_requested,
        "os.environ.get (the read it replaced)": lambda: os.environ.get("MLA_DCP_CHECK"),
        "fast_launch._hooked": fast_launch._hooked,
        "fast_launch._device_index": fast_launch._device_index,
        "torch.cuda.current_device (the call it replaced)": torch.cuda.current_device,
        "fast_launch._current_stream": lambda: fast_launch._current_stream(device),
        "q.shape + key tuple + dict get": lambda: {}.get((1, q.shape)),
        "torch.empty(64 int32, cuda)": lambda: torch.empty(64, dtype=torch.int32, device=q.device),
    }
    return {label: round(bench.host_time(fn, 20000) * 1e6, 3) for label, fn in rows.items()}


def main():
    argv = list(sys.argv)
    against = 0
    if "--against" in argv:
        at = argv.index("--against")
        against = int(argv[at + 1])
        del argv[at:at + 2]
    out_dir, names, turns = _ab.arguments(argv, ["C7", "R1"])
    assert native.wait() is not None, native.error()
    result = {"env": bench.environment(), "turns": turns, "against": against, "us_per_call": {}, "bitwise_equal": {}, "gates": {}}
    for name in names:
        step, pieces, _, case = _ab.step_pieces(name)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        with torch.inference_mode():
            for _ in range(3):      # plans made, then made native
                step()
        _, _, verify_natives, view_natives = api._eager_plans()
        view_plan = next(p for p in view_natives.values() if p is not None and p.cfg is cfg)
        verify_plan = next(p for p in verify_natives.values() if p is not None and p.cfg is cfg)
        view = view_plan.run(seq_lens, table)
        assert view is not None, "build_view's native plan refused its own layout"
        view_inputs = (seq_lens, table)
        verify_inputs = (q, kv, scale, view.row_lens, view.page_table, view.work, view.segments)
        stream = torch.cuda.current_stream().cuda_stream
        pieces = dict(pieces)
        pieces["build_view run_native"] = lambda: view_plan.sequence.run_native(view_inputs)
        pieces["build_view C++ run"] = lambda: view_plan.sequence.native.run(stream, view_inputs)
        pieces["verify run_native"] = lambda: verify_plan.sequence.run_native(verify_inputs)
        pieces["verify C++ run"] = lambda: verify_plan.sequence.native.run(stream, verify_inputs)
        # The API's plans (one block by default); the launchers' allocate each output apart always.
        plans = [getattr(p, "sequence", p).native for plans in fast_launch._PLANS for p in plans.values()
                 if getattr(getattr(p, "sequence", p), "native", None) is not None
                 and getattr(p, "sequence", p).separate is False]
        plans += [view_plan.sequence.native, verify_plan.sequence.native]

        def set_mode(mode):
            for plan in plans:
                plan.allocation = against if mode == "without" else 2

        times, outputs = _ab.timed_turns(step, pieces, lambda: None, turns, set_mode)
        times = {label: values for label, values in times.items() if not label.startswith("compiled")}
        equal = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(outputs["with"], outputs["without"]))
        _ab.report(result, name, times, equal, width=34)
        with torch.inference_mode():
            result["gates"][name] = gates(q)
        for label, value in result["gates"][name].items():
            print(f"{name} gate {label:48s} {value:7.3f} us", flush=True)
    (out_dir / f"native_split_against_{against}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
