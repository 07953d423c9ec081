#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD
P=benchmarks/probes/plan_variants.py
timeout 150 python3 $P $OUT inv64 C1+inv4096+mml8,C4+inv1024+mml8,R3+inv2048+mml8,C1+inv4096,C4+inv2048,R3+inv4096,R4+inv4096,C5+inv4096 > $OUT/inv_after.log 2>&1
timeout 60 python3 $P $OUT base C1,C4,C4f8,R6,C7f8,C2+fp8p > $OUT/base_after.log 2>&1
timeout 330 python3 -m pytest -q -n 8 -m gpu tests 2>&1 | tail -40 > $OUT/gpu_tests.log
