"""Whether the seesaw's build carries the L2 prefetches (PTX and SASS) on this machine."""
import pathlib, re, subprocess, sys, tempfile
import torch, triton
from mla_dcp import bench
from mla_dcp.ops import launchers
case = bench.make_case(sys.argv[1] if len(sys.argv) > 1 else "R1", torch.bfloat16)
with torch.inference_mode():
    bench.step_fns(case)[0]()
torch.cuda.synchronize()
k = launchers.last_attention_kernel
ptx = k.asm["ptx"]
tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(k.asm["cubin"]); f.flush()
    sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
print("entry", re.findall(r"\.entry (\w+)", ptx), "ptx prefetches", ptx.count("cp.async.bulk.prefetch"),
      "sass lines with PF", [l.strip() for l in sass.splitlines() if "PF" in l or "PREFETCH" in l.upper()][:6])
