"""Host time per eager step with the API's step plans against without them, in turns.

    python benchmarks/probes/step_plans_ab.py OUT_DIR [C7 C4 R1 ...] [--turns N]

"without": ``api._planned`` returns False, so every call takes the full path
(validation, choices, the launchers' own plans); "with": a repeated layout
launches from its build_view and verify plans. Each figure is
``bench.host_time`` (1,000 back-to-back calls, no synchronisation), the
median over N turns (default 6; the modes take turns going first) of the
eager step, build_view and verify; also the step compiled with torch.compile (no CUDA graph), which the
plans do not touch (a control), and a bitwise check of both paths' outputs.
Writes OUT_DIR/step_plans_ab.json.
"""
import json
import sys

import torch

import _ab
import mla_dcp
from mla_dcp import api, bench


def main():
    out_dir, names, turns = _ab.arguments(sys.argv, ["C7", "C4", "R1"])
    planned = api._planned
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {}}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        step = bench.step_fns(case)[0]
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        pieces = {
            "eager step": step,
            "build_view": lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
            "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
        }
        compiled = torch.compile(step, fullgraph=True)
        times = {f"{label} {mode}": [] for label in (*pieces, "compiled step") for mode in ("without", "with")}
        outputs = {}
        with torch.inference_mode():
            for turn in range(turns):
                for mode in _ab.modes(turn):
                    api._planned = planned if mode == "with" else (lambda tensor, check: False)
                    try:
                        outputs[mode] = step()
                        for label, fn in pieces.items():
                            times[f"{label} {mode}"].append(bench.host_time(fn) * 1e6)
                        times[f"compiled step {mode}"].append(bench.host_time(compiled) * 1e6)
                    finally:
                        api._planned = planned
        _ab.report(result, name, times, all(torch.equal(a, b) for a, b in zip(outputs["with"], outputs["without"])),
                   width=28)
    (out_dir / "step_plans_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
