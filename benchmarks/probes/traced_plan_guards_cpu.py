"""(CPU) What a compiled step's guards paid for planning in the graph: a compiled function that
computes a GPU step's schedule shape from the static facts (what a traced ``build_view`` did before
``step_metadata_auto``; the H200's facts and tuned plans, C7's shape, a static batch) against one
that does not, host us per call in alternating turns (Dynamo's guards re-check what the planning
read: the tuned table, ``dataclasses.replace``'s fields, the plan's attributes).

    python benchmarks/probes/traced_plan_guards_cpu.py
"""
import time

import torch

from mla_dcp.ops import tiles

tiles._device_facts = lambda device: ("NVIDIA H200", 132)
CUDA0 = torch.device("cuda", 0)


def planned(x):
    items, programs = tiles.gpu_schedule_shape(None, 64, 64, 32, 512, x.shape[0], CUDA0, torch.bfloat16,
                                               torch.bfloat16)
    return x + items + programs


def plain(x):
    return x + 1


def per_call(fn, calls=5000):
    for _ in range(100):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


x = torch.zeros(1)
with torch.inference_mode():
    for turn in range(2):
        for label, fn in (("without planning", plain), ("planning in the graph", planned)):
            torch._dynamo.reset()
            compiled = torch.compile(fn, fullgraph=True, backend="eager")
            compiled(x)
            print(f"turn {turn}: {label:24s} {per_call(lambda: compiled(x)):6.2f} us", flush=True)
