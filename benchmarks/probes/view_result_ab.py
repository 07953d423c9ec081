"""build_view's native path, in one process and in turns: the VerifyView made by the plan's C++
call (``Plan.set_result``, what the API does) against the same call returning a plain tuple that
Python turns into the VerifyView (what it did before), over the same recorded launches.

    python benchmarks/probes/view_result_ab.py OUT_DIR [C7 R1 ...] [--turns N]

Each figure is ``bench.host_time`` (1,000 back-to-back calls, no synchronisation), the median over
N turns (default 6) whose modes alternate which goes first: "with" the API's build_view as it is,
"without" its plan swapped for one of the old shape. Also the C++ call alone in both shapes, and
the Python VerifyView construction alone. Writes OUT_DIR/view_result_ab.json.
"""
import copy
import json
import sys
import torch

import _ab
import mla_dcp
from mla_dcp import api, bench
from mla_dcp.ops import fast_launch, native


class _TupleSequence:
    """A build_view plan's sequence whose C++ call returns a plain tuple that Python turns into
    the VerifyView: the shape before set_result, as deep in calls as that path was."""

    def __init__(self, sequence, cfg):
        self.sequence, self.native, self.cfg = sequence, sequence.native, cfg

    def run_native(self, inputs):
        made = self.sequence.run_native(inputs)
        if made is None:
            return None
        return api.VerifyView(made[0], made[3], made[1], made[2], self.cfg)


def main():
    out_dir, names, turns = _ab.arguments(list(sys.argv), ["C7", "R1"])
    assert native.wait() is not None, native.error()
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {}}
    for name in names:
        step, pieces, _, case = _ab.step_pieces(name)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        with torch.inference_mode():
            for _ in range(3):      # plans made, then made native
                step()
        views = api._eager_plans()[3]
        key, plan = next((k, p) for k, p in views.items() if p is not None and p.cfg is cfg)
        view = plan.run(seq_lens, table)
        sliced = api._facts(cfg).page_size == cfg.block_size and table.stride(-1) == 1   # as build_view decides
        recorded = (view.row_lens, view.work, view.segments) + (() if sliced else (view.page_table,))
        old = copy.copy(plan.sequence)
        old.native = native.plan_of(old, (seq_lens, table, *recorded), 2, fast_launch.rebased)
        if sliced:
            old.native.add_slice(1, 1, view.page_table.shape[1])
        tuple_plan = api._ViewPlan(cfg, _TupleSequence(old, cfg))
        stream = torch.cuda.current_stream().cuda_stream
        view_inputs = (seq_lens, table)
        pieces = {
            "build_view (API)": pieces["build_view"],
            "eager step": step,
            "C++ run": lambda: plan.sequence.native.run(stream, view_inputs),
            "C++ run, plain tuple + VerifyView": lambda: tuple_plan.run(seq_lens, table),
        }

        def set_mode(mode):
            views[key] = tuple_plan if mode == "without" else plan

        times, outputs = _ab.timed_turns(step, pieces, lambda: None, turns, set_mode)
        times = {label: values for label, values in times.items() if not label.startswith("compiled")}
        equal = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(outputs["with"], outputs["without"]))
        _ab.report(result, name, times, equal, width=34)
        with torch.inference_mode():
            alone = bench.host_time(lambda: mla_dcp.VerifyView(*view[:4], cfg), 20000) * 1e6
        result["us_per_call"][f"{name} VerifyView() from Python"] = round(alone, 3)
        print(f"{name} VerifyView() from Python {alone:.3f} us", flush=True)
    (out_dir / "view_result_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
