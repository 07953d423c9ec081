#!/bin/bash
# Run zz41 (sixteenth session, call 1), from the repository root on the H200 with the test wheels
# in .whl, the working tree at 467a406: q loaded by TMA in both Gluon kernels over 16-bit and e4m3
# caches (benchmarks/candidates/run_all.sh q_tma: edge cases on both dtypes, then C1, C2, C6, C4
# beside the committed kernels in three turns). Results under $OUT/cand.
set -u
date +%T
timeout 570 bash benchmarks/candidates/run_all.sh q_tma
date +%T
rm -f $OUT/cand/*/roofline.png
