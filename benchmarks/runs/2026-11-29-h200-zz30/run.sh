#!/bin/bash
# Run zz30 (fourteenth session, call 7), from the repository root on the H200 with the test wheels
# in .whl: what a one-step graph's timing holds besides its kernels, with the read flush added (scripts/graph_overhead.py; C4 twice: run-to-run spread).
set -u
. benchmarks/runs/device_env.sh
date +%T
timeout 300 python3 scripts/graph_overhead.py $OUT/overhead C4,C7,C4 2>&1 | tee $OUT/overhead.log | tail -12
date +%T
