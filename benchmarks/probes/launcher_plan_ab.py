"""Host time with the merged-attention launcher's own plan against without it, in turns.

    python benchmarks/probes/launcher_plan_ab.py OUT_DIR [C7 C4 R1 ...] [--turns N]

"without": the launcher's plan cache answers "no plan" for every key, so
each call takes the launchers' per-kernel replays (what it did before the
plan); "with": a repeated layout launches from one fast_launch.Sequence.
Timed (``bench.host_time``, 1,000 back-to-back calls, no synchronisation;
median over N turns, default 6, the modes taking turns going first): the op
through the dispatcher, eager; the step compiled with torch.compile (no CUDA
graph), with the batch static and, where B > 2, dynamic (compiled again
after a second batch size); the eager step (the API's own verify plan on
top). Outputs of both modes compared bit for bit. Writes
OUT_DIR/launcher_plan_ab.json.
"""
import json
import sys
import types

import torch

import _ab
import mla_dcp
from mla_dcp import api, bench
from mla_dcp.ops import launchers


def _fresh(fn):
    """fn with a code object of its own: Dynamo keeps one cache per code object."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class _NoPlans(dict):
    def get(self, key, default=None):
        return None


def main():
    out_dir, names, turns = _ab.arguments(sys.argv, ["C7", "C4", "R1"])
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {}}
    plans = launchers._MERGED_PLANS
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]

        def step(seq_lens, table, q, kv):
            view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
            return mla_dcp.verify(cfg, view, q, kv, scale)

        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        facts = api._facts(cfg)
        op_args = (q, kv, scale, view.row_lens, view.page_table, view.work, view.segments, cfg.qlen,
                   cfg.kv_lora_rank, facts.scale, facts.schedule_chunk, cfg.fp8_products)
        op = torch.ops.mla_dcp.merged_attention.default
        batch = seq_lens.shape[0]
        with torch.inference_mode():
            torch._dynamo.reset()
            static = torch.compile(_fresh(step), fullgraph=True)
            static(seq_lens, table, q, kv)
            pieces = {"op via dispatcher": lambda: op(*op_args),
                      "compiled step, static batch": lambda: static(seq_lens, table, q, kv),
                      "eager step": lambda: step(seq_lens, table, q, kv)}
            if batch > 2:
                dynamic = torch.compile(_fresh(step), fullgraph=True)
                half = batch // 2
                dynamic(seq_lens, table, q, kv)
                dynamic(seq_lens[:half], table[:half], q[:half * cfg.qlen], kv)
                pieces["compiled step, dynamic batch"] = lambda: dynamic(seq_lens, table, q, kv)
            times = {f"{label} {mode}": [] for label in pieces for mode in ("without", "with")}
            outputs = {}
            for turn in range(turns):
                for mode in _ab.modes(turn):
                    launchers._MERGED_PLANS = plans if mode == "with" else _NoPlans()
                    try:
                        outputs[mode] = [fn() for fn in pieces.values()]
                        for label, fn in pieces.items():
                            times[f"{label} {mode}"].append(bench.host_time(fn) * 1e6)
                    finally:
                        launchers._MERGED_PLANS = plans
        _ab.report(result, name, times, all(torch.equal(a.nan_to_num(), b.nan_to_num())
                                            for got, want in zip(outputs["with"], outputs["without"])
                                            for a, b in zip(got, want)))
    (out_dir / "launcher_plan_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
