#!/bin/bash
# Run zz31 (fourteenth session, call 8), from the repository root on the H200 with the test wheels in .whl:
# run zz18's Nsight Compute commands on C2 with the scores reordered (commit abc39ac's kernel), kept as
# run zz22 kept them (details, raw and SASS pages), to compare with run zz22.
bash "$(dirname "$0")/../2026-11-29-h200-zz22/run.sh"
