#!/bin/bash
# Run zz40 (fifteenth session, call 8), from the repository root on the H200 with the test wheels
# in .whl, the working tree at 6908738 + run_all.sh's q_loaded block: 16-bit q loaded through
# registers instead of cp.async, timing only (benchmarks/candidates/run_all.sh q_loaded).
set -u
date +%T
timeout 330 bash benchmarks/candidates/run_all.sh q_loaded
date +%T
