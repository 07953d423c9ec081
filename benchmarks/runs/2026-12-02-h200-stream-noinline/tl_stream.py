"""Narrow-kernel timeline of bench configs with the schedule build_view gives (MLA_DCP_STREAM decides).
PYTHONPATH=.:benchmarks/probes python gpu_run/tl_stream.py LABEL C4,R3u,..."""
import json, sys, torch
import mla_dcp
from mla_dcp import bench
from mla_dcp._shapes import page_size_for
from mla_dcp.ops import launchers
from mla_dcp.ops.gluon_kernels import narrow
import seesaw_timeline as st

label, names = sys.argv[1], sys.argv[2].split(",")
committed = narrow
if len(sys.argv) > 3:
    import importlib
    sys.path.insert(0, "gpu_run")
    narrow = importlib.import_module(sys.argv[3])
res = {"label": label}
for name in names:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    views = [(mla_dcp.build_view(cfg, s, t), q, kv, sc) for s, t, q, kv, sc in case.inputs]
    view, q, kv, sc = views[0]
    page = page_size_for(kv.shape[1])
    outputs = launchers.attention_outputs(q, cfg.kv_lora_rank, view.work.shape[0], cfg.qlen, False)
    mt = -(-cfg.qlen * q.shape[1] // 32)
    rows = mt * view.work.shape[0]
    stamps = torch.zeros(rows, st.SLOTS, dtype=torch.int64, device=q.device)
    run = lambda v, q, kv, sc, buf: narrow.launch(q, kv, sc, v.row_lens, v.page_table, v.work, cfg.qlen, 512,
                                                   cfg.scale, outputs, False, page, 32, stamps=buf)
    for _ in range(3):
        run(view, q, kv, sc, stamps)
    torch.cuda.synchronize()
    s = stamps.cpu()
    if narrow is not committed:
        from mla_dcp.testing import ran_rows
        mine = [t.clone() for t in outputs]
        committed.launch(q, kv, sc, view.row_lens, view.page_table, view.work, cfg.qlen, 512, cfg.scale, outputs,
                         False, page, 32)
        torch.cuda.synchronize()
        rows = ran_rows(view.work)
        same = all(torch.equal(a[rows], b[rows]) for a, b in zip(mine, outputs))
        print(label, name, "equal to the committed build:", same, flush=True)
    ran = s[s[:, 10] > 0]
    rep = st.analyse(ran, ran.shape[0], "narrow")
    t = []
    for _ in range(2):
        for buf in (None,):
            fns = [lambda a=a: run(*a, None) for a in views]
            t.append(bench.time_fn(bench._rotating(bench._graphed(fns))) * 1e6)
    rep["graph_us"] = t
    rep["work_cols"] = view.work.shape[1]
    rep["grid"] = rows
    res[name] = rep
    ph = rep["phases_us"]
    print(label, name, "cols", view.work.shape[1], "grid", rows, "ran", ran.shape[0], "graph", [round(x, 1) for x in t],
          "span %.1f" % rep["span_us"], "sm_end", {k: round(v, 1) for k, v in rep["sm_end_us"].items()},
          "busy %.3f" % rep["sm_busy_fraction"], "start_spread", {k: round(v, 1) for k, v in rep["first_start_spread_us"].items()},
          " ".join(f"{k}={v['median']:.2f}" for k, v in ph.items()), flush=True)
print(json.dumps(res))
