#!/bin/bash
# Run zz33 (fifteenth session, call 1), from the repository root on the H200 with the test wheels
# in .whl: C4's KV stream alone on P programs with S tiles in flight (scripts/stream_probe.py),
# beside the committed attention kernel, the row-lengths kernel and the merge alone, and the ceilings.
set -u
. benchmarks/runs/device_env.sh
date +%T
timeout 400 python3 scripts/stream_probe.py $OUT/probe 2>&1 | tee $OUT/probe.log | tail -30
date +%T
