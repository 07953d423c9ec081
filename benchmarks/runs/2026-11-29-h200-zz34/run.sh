#!/bin/bash
# Run zz34 (fifteenth session, call 2), from the repository root on the H200 with the test wheels
# in .whl: an e4m3 program's q staging, two candidates against the committed seesaw
# (benchmarks/candidates/run_all.sh q_staging; edge cases of the two-pass form, then C2 and C1 in
# three turns). Results under $OUT/cand.
set -u
date +%T
timeout 560 bash benchmarks/candidates/run_all.sh q_staging
date +%T
