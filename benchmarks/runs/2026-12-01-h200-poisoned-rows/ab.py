"""A/B of one tree's graphed verify step (run as: PYTHONPATH=TREE python ab.py LABEL CONFIGS)."""
import json, sys, statistics
import torch
from mla_dcp import bench
label, names = sys.argv[1], sys.argv[2].split(",")
ceil = bench.measure_ceilings()
rows = {"label": label, "ceilings": ceil}
for name in names:
    case = bench.make_case(name, torch.bfloat16)
    graphed = bench._graphed_sequence(bench.step_fns(case), bench.STEPS_PER_GRAPH)
    t = [bench.time_fn(graphed) / bench.STEPS_PER_GRAPH for _ in range(3)]
    rows[name] = statistics.median(t) * 1e6
    del case, graphed
    torch.cuda.empty_cache()
print(json.dumps(rows))
