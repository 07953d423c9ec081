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
from mla_dcp import api, bench


def main():
    out_dir, names, turns = _ab.arguments(sys.argv, ["C7", "C4", "R1"])
    planned = api._planned
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {}}
    for name in names:
        step, pieces, compiled, _ = _ab.step_pieces(name)

        def set_mode(mode):
            api._planned = (lambda tensor, check: False) if mode == "without" else planned

        times, outputs = _ab.timed_turns(step, pieces, compiled, turns, set_mode)
        _ab.report(result, name, times, all(torch.equal(a, b) for a, b in zip(outputs["with"], outputs["without"])),
                   width=28)
    (out_dir / "step_plans_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
