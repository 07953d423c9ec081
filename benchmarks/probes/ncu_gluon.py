"""A few launches of a Gluon attention kernel on one benchmark config, for Nsight Compute:

    ncu --clock-control none -k regex:"seesaw|narrow" --launch-skip 2 -c 1 --set full \\
        --import-source yes -o REPORT python3 benchmarks/probes/ncu_gluon.py SPEC

SPEC as in benchmarks/probes/seesaw_timeline.py (``NAME[:N][@KERNEL]``): ``C2`` is the seesaw on an
e4m3 cache at its tuned segment count, ``C4@narrow`` the narrow kernel, ``C2:4`` forces 4
segments. ``--clock-control none``: the device notes ask to leave the clocks alone. Only the
Gluon kernel is launched here after the view is built, so ``-k`` picks it alone.
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import seesaw_timeline  # noqa: E402

name, forced, kind, block_m = seesaw_timeline.parse_spec(sys.argv[1])
cfg, views, ns, finalize, outputs, page = seesaw_timeline.attention_case(name, forced)
run = seesaw_timeline.launcher(seesaw_timeline.MODULES[kind], kind, cfg, ns, outputs, finalize, page, block_m)
for _ in range(4):
    run(*views[0])
torch.cuda.synchronize()
