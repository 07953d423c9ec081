#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python3 benchmarks/probes/host_time.py $OUT C7 C4 R1 > $OUT/host_time.log 2>&1; tail -n 15 $OUT/host_time.log
C=C7,C4,C1,R4
timeout 75 python3 -m mla_dcp.bench --configs $C --no-baselines --out $OUT/default > $OUT/default.log 2>&1; tail -n 5 $OUT/default.log
timeout 75 python3 -m mla_dcp.bench --configs $C --no-baselines --batch-invariant --out $OUT/inv4096 > $OUT/inv4096.log 2>&1; tail -n 5 $OUT/inv4096.log
timeout 75 python3 -m mla_dcp.bench --configs $C --no-baselines --batch-invariant --invariant-segment-tokens 1024 --out $OUT/inv1024 > $OUT/inv1024.log 2>&1; tail -n 5 $OUT/inv1024.log
for d in default inv4096 inv1024; do cp $OUT/$d/results.json $OUT/$d.json 2>/dev/null; rm -rf $OUT/$d; done
