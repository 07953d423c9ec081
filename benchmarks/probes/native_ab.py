"""Host time per eager step with the native plans (ops/native.py) against without, in turns.

    python benchmarks/probes/native_ab.py OUT_DIR [C7 C4 R1 ...] [--turns N]

"without": ``native.enabled`` off, so the plans launch from Python
(fast_launch.Sequence); "with": from C++. The module is built first
(``native.wait()``). Each figure is ``bench.host_time`` (1,000 back-to-back
calls, no synchronisation), the median over N turns (default 6; the modes
take turns going first) of the eager step, build_view, verify, and the step
compiled with torch.compile (no CUDA graph; its op takes the launcher's
plan, native too); also a bitwise check of both paths' outputs and the count
of plans that went native. Writes OUT_DIR/native_ab.json.
"""
import json
import sys
import time

import torch

import _ab
from mla_dcp import bench
from mla_dcp.ops import fast_launch, native


def main():
    out_dir, names, turns = _ab.arguments(sys.argv, ["C7", "C4", "R1"])
    started = time.perf_counter()
    built = native.wait()
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {},
              "build_s": round(time.perf_counter() - started, 1), "build_error": native.error(), "native_plans": {}}
    print(f"native module: {built} ({result['build_s']} s) {native.error() or ''}", flush=True)
    for name in names:
        step, pieces, compiled, _ = _ab.step_pieces(name)
        with torch.inference_mode():
            for _ in range(3):      # plans made, then made native
                step(), compiled()

        def set_mode(mode):
            native.enabled = mode != "without"

        times, outputs = _ab.timed_turns(step, pieces, compiled, turns, set_mode)
        torch.cuda.synchronize()
        result["native_plans"][name] = sum(1 for plans in fast_launch._PLANS for p in plans.values()
                                           if getattr(getattr(p, "sequence", p), "native", None) is not None)
        print(f"{name} native plans: {result['native_plans'][name]}; refused: {native.refusals}", flush=True)
        result.setdefault("refusals", {})[name] = dict(native.refusals)
        _ab.report(result, name, times, all(torch.equal(a, b) for a, b in zip(outputs["with"], outputs["without"])),
                   width=28)
    (out_dir / "native_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
