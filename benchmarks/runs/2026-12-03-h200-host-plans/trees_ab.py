"""One tree's host times: eager step, verify, compiled static, compiled dynamic."""
import json, sys, torch, mla_dcp
from mla_dcp import bench
label = sys.argv[1]
out = {"tree": label, "file": mla_dcp.__file__}
for name in sys.argv[2:]:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]
    def step(seq_lens, table, q, kv):
        return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale)
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    rows = {}
    with torch.inference_mode():
        rows["eager step"] = bench.host_time(lambda: step(seq_lens, table, q, kv)) * 1e6
        rows["verify"] = bench.host_time(lambda: mla_dcp.verify(cfg, view, q, kv, scale)) * 1e6
        torch._dynamo.reset()
        c = torch.compile(step, fullgraph=True)
        want = step(seq_lens, table, q, kv)
        got = c(seq_lens, table, q, kv)
        rows["compiled equal"] = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got, want))
        rows["compiled static"] = bench.host_time(lambda: c(seq_lens, table, q, kv)) * 1e6
        B = seq_lens.shape[0]
        if B > 2:
            h = B // 2
            c(seq_lens[:h], table[:h], q[:h * cfg.qlen], kv)   # a second batch size: the dynamic graph
            got = c(seq_lens, table, q, kv)
            rows["dynamic equal"] = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got, want))
            rows["compiled dynamic"] = bench.host_time(lambda: c(seq_lens, table, q, kv)) * 1e6
    out[name] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in rows.items()}
    print(label, name, out[name], flush=True)
print("JSON", json.dumps(out), flush=True)
