#!/bin/bash
# Run zz38 (fifteenth session, call 6), from the repository root on the H200 with the test wheels
# in .whl, the working tree at c71dd85: over an e4m3 cache, q copied before the KV copies and moved
# into fp16 in shared memory (benchmarks/candidates/run_all.sh q_first: e4m3 edge cases, then C2
# and C1 beside the committed kernel in three turns). Results under $OUT/cand.
set -u
date +%T
timeout 500 bash benchmarks/candidates/run_all.sh q_first
date +%T
