#!/bin/bash
# Run zz44 (sixteenth session, call 4), from the repository root on the H200 with the test wheels
# in .whl: a latent half's e4m3 conversion in two passes, low columns first (fewer live values, no
# loop spills), beside the committed kernel (benchmarks/candidates/run_all.sh convert_low_first:
# e4m3 edge cases, then C2 and C1 in three turns).
set -u
date +%T
timeout 420 bash benchmarks/candidates/run_all.sh convert_low_first
date +%T
rm -rf $OUT/cand/*/roofline.png $OUT/cand/*/results.json
