#!/bin/bash
# Run zz29 (fourteenth session, call 6), from the repository root on the H200 with the test wheels
# in .whl: what a one-step graph's timing holds besides its kernels (scripts/graph_overhead.py).
set -u
. benchmarks/runs/device_env.sh
date +%T
timeout 300 python3 scripts/graph_overhead.py $OUT/overhead C4,C7,C1,C2 2>&1 | tee $OUT/overhead.log | tail -12
date +%T
