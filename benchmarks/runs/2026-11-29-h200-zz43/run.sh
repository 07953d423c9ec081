#!/bin/bash
# Run zz43 (sixteenth session, call 3), from the repository root on the H200 with the test wheels
# in .whl: a latent half's e4m3 conversion stored in one statement (no barrier-pass bar.syncs
# between its 64-column stores) or in two 128-column ones, beside the committed kernel
# (benchmarks/candidates/run_all.sh convert_whole: e4m3 edge cases, then C2 and C1 in three turns).
set -u
date +%T
timeout 560 bash benchmarks/candidates/run_all.sh convert_whole
date +%T
rm -rf $OUT/cand/*/roofline.png
