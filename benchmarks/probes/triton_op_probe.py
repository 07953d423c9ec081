"""Would an op inductor sees into cost a compiled graph less than an extern op?

    python benchmarks/probes/triton_op_probe.py OUT_DIR [C7 R1 ...]

A compiled graph pays ~40 us for an extern op above the op's own call (docs/performance.md, "What
a compiled step is made of"), where inductor's own kernels cost a few. ``torch.library.triton_op``
lets inductor trace an op's implementation and launch its Triton kernels from its own wrapper. This
probe defines build_view's metadata launch (``step_metadata``: one Triton kernel, no Gluon, no
descriptor) that way and times, host us per call (``bench.host_time``, inference mode): the extern
op eagerly and compiled alone, the triton_op eagerly and compiled alone, and a compiled function
returning its input; then checks the triton_op's outputs equal the extern op's bit for bit (eager
and compiled). PDL is off in the triton_op (inductor's user-kernel launches take no PDL option);
run with ``MLA_DCP_PDL=0`` for the extern op without it too. Writes OUT_DIR/triton_op_probe.json. The kernel and its arguments are the launcher's; only the way
the op is registered differs.
"""
import json
import pathlib
import sys

import torch
import triton
from torch.library import triton_op, wrap_triton

from mla_dcp import api, bench
from mla_dcp.ops import launchers
from mla_dcp.ops.triton_kernels import kernels


@triton_op("mla_dcp_probe::step_metadata", mutates_args={})
def step_metadata(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int, causal: bool,
                  page: int, max_pages: int, num_items: int, chunk: int,
                  programs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mla_dcp::step_metadata`` (batch > 0), its kernel launched through ``wrap_triton``."""
    batch = seq_lens.shape[0]
    device = seq_lens.device
    out = torch.empty(batch * qlen, dtype=torch.int32, device=device)
    work, segments = launchers._schedule_outputs(batch, num_items, device, max_pages, chunk, programs)
    grid = (1 + triton.cdiv(batch * qlen, launchers._METADATA_BLOCK),)
    wrap_triton(kernels.step_metadata_kernel)[grid](
        seq_lens, out, work, segments, batch, num_items, max_pages, chunk, programs, QLEN=qlen, WORLD=world,
        RANK=rank, INTERLEAVE=interleave, CAUSAL=causal, PAGE=page, BLOCK=launchers._METADATA_BLOCK,
        **launchers._schedule_constants(batch, max_pages, programs), PDL=False)
    return out, work, segments


def arguments(name: str) -> tuple:
    """(seq_lens, then the op's static arguments) of config ``name``'s build_view."""
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, _, q, kv, _ = case.inputs[0]
    facts = api._facts(cfg)
    num_items, programs = api._schedule_shape_memo(cfg, seq_lens.shape[0], seq_lens.device, q.dtype, kv.dtype)
    return (seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.causal, facts.page_size,
            facts.max_pages, num_items, facts.schedule_chunk, programs)


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [a for a in sys.argv[2:] if not a.startswith("--")] or ["C7", "R1"]
    result = {"env": bench.environment(), "us_per_call": {}, "bitwise_equal": {}}
    for name in names:
        args = arguments(name)
        extern = torch.ops.mla_dcp.step_metadata.default
        seen = torch.ops.mla_dcp_probe.step_metadata.default
        with torch.inference_mode():
            pieces = {
                "extern op, eager": lambda: extern(*args),
                "triton_op, eager": lambda: seen(*args),
                "extern op, compiled alone": torch.compile(lambda: extern(*args), fullgraph=True),
                "triton_op, compiled alone": torch.compile(lambda: seen(*args), fullgraph=True),
                "compiled: return the input": torch.compile(lambda: args[0], fullgraph=True),
            }
            rows = {}
            for label, fn in pieces.items():
                rows[label] = round(bench.host_time(fn) * 1e6, 2)
                print(f"{name} {label:34s} {rows[label]:8.2f} us", flush=True)
            want = extern(*args)
            equal = {mode: all(torch.equal(a, b) for a, b in zip(pieces[f"triton_op, {mode}"](), want))
                     for mode in ("eager", "compiled alone")}
        result["us_per_call"][name] = rows
        result["bitwise_equal"][name] = equal
        print(f"{name} bitwise equal to the extern op: {equal}", flush=True)
    (out_dir / "triton_op_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
