#!/bin/bash
# Run zz26 (fourteenth session, call 3), from the repository root on the H200 with the test wheels
# in .whl: the seesaw (scores own half, rope, other half; commit abc39ac) alone under a CUDA graph
# at several segment counts per config, to refit the segment model (e4m3 and bf16) and check the
# bf16 model away from the counts it was fitted at.
set -u
. benchmarks/runs/device_env.sh
date +%T
PROBE_EDGE=0 timeout 560 python3 scripts/seesaw_probe.py $OUT/counts C2,C1,C3,C6,C5 seesaw > $OUT/counts.log 2>&1
grep -v edge $OUT/counts.log | tail -40; date +%T
