"""Programs per multiprocessor of the narrow kernel as the driver sees them
(cuOccupancyMaxActiveBlocksPerMultiprocessor), for each plan the launcher
can pick at C4's and C2's shapes: `python scripts/occupancy.py`."""
import torch
from cuda.bindings import driver

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import launchers, narrow

for name, stages in (("C4", 2), ("C4", 1), ("C2", 2), ("C2", 1)):
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]
    view = mla_dcp.build_view(cfg, seq_lens, table)
    partials = launchers.attention_outputs(q, 512, 2, finalize=False)
    kernel = narrow.launch(q, kv, scale, view.row_lens, view.page_table, cfg.qlen, 512, 2, cfg.scale, partials,
                           False, 64, 32, stages)
    err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(kernel.function), 128,
                                                                    kernel.metadata.shared)
    print(f"{name} stages={stages}: shared {kernel.metadata.shared} B, registers {kernel.n_regs}, "
          f"programs per SM {blocks} ({err})", flush=True)
