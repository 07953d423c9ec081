"""(CPU) What each schedule predicts for the attention kernel of the benchmark's steps.

    python benchmarks/probes/schedule_model.py [CONFIGS] [--sms N]

A list-scheduling model with the tuned plans' measured costs (``token_ns`` per
KV token, ``program_us`` per program): the GPU hands programs out in launch
order to ``sms * ctas_per_sm`` slots. For the one-piece-per-program schedule
(``pure.build_schedule`` with ``programs == 0``) every piece is a program;
for the stream (``programs > 0``) a program runs its run's pieces in turn, and
the model charges every piece with pages a whole ``program_us`` (pessimistic:
a program pays its launch and prologue once) and an empty one EMPTY_PIECE_US. It predicts, it measures nothing:
compare its ratios with a GPU run before trusting them.
"""
from __future__ import annotations

import argparse
import heapq
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from mla_dcp import pure  # noqa: E402
from mla_dcp.bench import lengths_of, shape_of  # noqa: E402
from mla_dcp.ops import tiles  # noqa: E402

PAGE = 64
# An empty piece (an unused row's, or a request with no page): its q copy and
# empty statistics only. An assumption, not a measurement.
EMPTY_PIECE_US = 1.0


def predict(name: str, sms: int) -> dict:
    _, qlen, heads, _, _, kv = shape_of(name)
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    lengths = lengths_of(name)
    batch, rows = len(lengths), qlen * heads
    device = torch.device("cuda", 0)
    max_pages = -(-max(lengths) // PAGE)
    plan = tiles.attention_plan(rows, 512, torch.bfloat16, kv_dtype, PAGE, device, batch)
    segments = tiles.gpu_num_segments(max_pages, batch, rows, 512, torch.bfloat16, kv_dtype, PAGE, device)
    m_tiles = -(-rows // plan.block_m)
    step = 2 * plan.block_n if plan.seesaw else plan.block_n
    row_lens = torch.tensor([n - (qlen - 1 - t) for n in lengths for t in range(qlen)], dtype=torch.int32)

    def piece_us(lo, hi):
        if hi == lo:
            return EMPTY_PIECE_US
        tokens = -(-(hi - lo) * PAGE // step) * step
        return plan.program_us + tokens * plan.token_ns * 1e-3

    def makespan(programs_us):
        slots = [0.0] * (sms * plan.ctas_per_sm)
        for us in programs_us:
            for _ in range(m_tiles):
                heapq.heapreplace(slots, slots[0] + us)
        return max(slots)

    work, _ = pure.build_schedule(row_lens, qlen, PAGE, max_pages, batch * segments)
    chunked = makespan([piece_us(lo, hi) for _, lo, hi in work.tolist()])
    work, _ = pure.build_schedule(row_lens, qlen, PAGE, max_pages, batch * segments + batch,
                                  programs=batch * segments)
    runs = [sum(piece_us(lo, hi) for _, lo, hi in work[first:end, :3].tolist())
            for first, end in work[:, 3:].tolist() if end > first]
    return {"config": name, "segments": segments, "kernel": "seesaw" if plan.seesaw else
            "narrow" if plan.narrow else "triton", "chunked_us": round(chunked, 1),
            "stream_us": round(makespan(runs), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="?", default="R1,R1u,R2,R2u,R3,R3u,R4,R4u,C1,C4,C7")
    parser.add_argument("--sms", type=int, default=132, help="multiprocessors (H200: 132)")
    args = parser.parse_args()
    tiles._DEVICE_FACTS[0] = ("NVIDIA H200", args.sms)   # the tuned plans' device, without one
    print("| config | kernel | segments | one piece per program us | stream us |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in args.configs.split(","):
        row = predict(name, args.sms)
        print(f"| {row['config']} | {row['kernel']} | {row['segments']} | {row['chunked_us']} | {row['stream_us']} |")


if __name__ == "__main__":
    main()
