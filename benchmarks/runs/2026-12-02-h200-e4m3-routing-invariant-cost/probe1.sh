#!/usr/bin/env bash
# e4m3 kernel routing variants, then the default mode of the invariance configs
set -u
export PYTHONPATH=$PWD
P=benchmarks/probes/plan_variants.py
E4=C4f8,C4f8+fp8p,C7f8,C7f8+fp8p,R1f8,R1f8+fp8p,R6,R6+fp8p,C4,C2+fp8p
for v in base narrow8 seesaw8; do
  timeout 170 python3 $P $OUT $v $E4 2>&1 | grep -v Warning | tee -a $OUT/probe1.log
done
