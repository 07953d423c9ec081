#!/usr/bin/env bash
# batch-invariant mode: segment lengths and tile plans beside the default mode; a longer static bound
set -u
export PYTHONPATH=$PWD
P=benchmarks/probes/plan_variants.py
ALL="C1 C3 C4 C5 C7 R1 R2 R3 R4"
join() { local IFS=,; echo "$*"; }
cases=(); for c in $ALL; do cases+=("$c"); done
cases+=(C4+mml8 C7+mml8 C1+mml8 R3+mml8)
timeout 120 python3 $P $OUT base "$(join "${cases[@]}")" 2>&1 | grep -v Warning >> $OUT/probe2.log
cases=(); for s in 1024 2048 4096; do for c in $ALL; do cases+=("$c+inv$s"); done; done
cases+=(C4+inv1024+mml8 C4+inv4096+mml8 C7+inv1024+mml8 C1+inv4096+mml8 R3+inv2048+mml8)
timeout 260 python3 $P $OUT inv64 "$(join "${cases[@]}")" 2>&1 | grep -v Warning >> $OUT/probe2.log
cases=(); for s in 1024 2048 4096; do for c in C4 C7 R1 R3; do cases+=("$c+inv$s"); done; done
timeout 120 python3 $P $OUT invH "$(join "${cases[@]}")" 2>&1 | grep -v Warning >> $OUT/probe2.log
