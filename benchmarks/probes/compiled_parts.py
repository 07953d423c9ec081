"""Where a compiled step's host time goes (GPU): each layer between the
compiled function and the launchers, timed alone, and the dispatch state a
launcher sees inside the compiled graph.

    python benchmarks/probes/compiled_parts.py OUT_DIR [C7 ...]

Host us per call (``bench.host_time``, inference mode) of: the merged
attention launcher called directly, the same op through the dispatcher
(eager), a compiled function holding only that op, a compiled function that
returns its input, the compiled step and the eager step; whether the
launcher took its own replay inside the compiled graph; a cProfile of the
compiled step (tottime and cumulative). Everything goes to OUT_DIR/compiled_parts.txt.
"""
import pathlib
import sys

import torch

import _ab
import mla_dcp
from mla_dcp import api, bench
from mla_dcp.ops import fast_launch, launchers, library, native


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def say(text):
        print(text, flush=True)
        lines.append(text)

    if native.enabled and native.wait() is None:
        say(f"native plans unavailable: {native.error()}")
    for name in sys.argv[2:] or ["C7"]:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        step = bench.step_fns(case)[0]
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        facts = api._facts(cfg)
        args = (q, kv, scale, view.row_lens, view.page_table, view.work, view.segments, cfg.qlen,
                cfg.kv_lora_rank, facts.scale, facts.schedule_chunk, cfg.fp8_products)
        op = torch.ops.mla_dcp.merged_attention.default
        seen = []
        real = launchers.merged_attention
        replays = []
        real_replay_call = fast_launch.Replay.__call__

        def counting_replay(self, *a, **k):
            replays.append(1)
            return real_replay_call(self, *a, **k)

        def watching(*a):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                         torch._C._len_torch_dispatch_stack(), torch._C._is_torch_function_mode_enabled(),
                         str(torch._C._dispatch_tls_local_include_set()),
                         str(torch._C._dispatch_tls_local_exclude_set())))
            return real(*a)

        with torch.inference_mode():
            pieces = {
                "launcher direct": lambda: real(*args),
                "op via dispatcher (eager)": lambda: op(*args),
                "compiled: that op alone": torch.compile(lambda: op(*args), fullgraph=True),
                "compiled: return the input": torch.compile(lambda: q, fullgraph=True),
                "compiled: two aten ops, same inputs": torch.compile(
                    lambda: (torch.ops.aten.empty_like(q), torch.ops.aten.empty_like(view.work)), fullgraph=True),
                "compiled step": torch.compile(step, fullgraph=True),
                "eager step": step,
                "verify (eager)": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
            }
            for _ in range(3):
                op(*args)       # the launcher's plan, and its native plan
            sources = (q, kv, scale, view.row_lens, view.page_table, view.work, view.segments)
            # The plan of these inputs' layouts (another's native call would time its refusal).
            planned = [p for p in launchers._MERGED_PLANS.values()
                       if p is not None and p.native is not None and p.native.matches(sources)]
            if planned:
                pieces["launcher's native plan, run_native"] = lambda: planned[0].run_native(sources)
                stream = torch.cuda.current_stream().cuda_stream
                pieces["launcher's native plan, C++ run"] = lambda: planned[0].native.run(stream, sources)
            for label, fn in pieces.items():
                say(f"{name} {label:38s} {bench.host_time(fn) * 1e6:8.2f} us")
            library._LAUNCHERS["merged_attention"] = watching
            fast_launch.Replay.__call__ = counting_replay
            try:
                pieces["compiled step"]()
                torch.cuda.synchronize()
            finally:
                library._LAUNCHERS["merged_attention"] = real
                fast_launch.Replay.__call__ = real_replay_call
            say(f"{name} launcher inside the compiled step: (grad, inference, dispatch stack, function mode, "
                f"include, exclude) = {seen}; replays taken: {len(replays)}")
            lines.append(_ab.profile_text(pieces["compiled step"], top=35))
    (out_dir / "compiled_parts.txt").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
