#!/bin/bash
# Run zz22 (thirteenth session, call 4), from the repository root on the H200 with the test wheels in .whl:
# run zz18's Nsight Compute commands on C2 at commit 53f266a (conflict-free conversion). Kept from its
# outputs: the details, raw and SASS pages; the report and the CUDA-source page are dropped (the call
# returns a limited number of files).
bash "$(dirname "$0")/../2026-11-29-h200-zz18/run.sh"
rm -f $OUT/*.ncu-rep $OUT/ncu_C2_cuda.csv.gz
