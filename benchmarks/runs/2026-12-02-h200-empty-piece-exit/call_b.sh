#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -n 8 -m gpu tests/test_gpu.py tests/test_batch_invariant.py tests/test_poisoned.py -k "seesaw or rows_without or invariant or poisoned" 2>&1 | tail -4 > $OUT/tests.log
timeout 75 python3 benchmarks/probes/plan_variants.py $OUT inv64 C1+inv4096+mml8,R4+inv4096,C1+inv4096 > $OUT/inv.log 2>&1
timeout 40 python3 benchmarks/probes/plan_variants.py $OUT base C1,C2 > $OUT/base.log 2>&1
