#!/usr/bin/env bash
# fp8 products: GPU tests, accuracy against float64, bench of both modes
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -rf -x -m gpu tests/test_fp8_products.py -p no:cacheprovider > $OUT/gpu_fp8p.log 2>&1; echo "tests rc=$?"; tail -n 3 $OUT/gpu_fp8p.log
timeout 110 python3 benchmarks/probes/fp8_products_accuracy.py $OUT/acc C2,R5,C3f8,C5f8 > $OUT/accuracy.log 2>&1; echo "acc rc=$?"; cat $OUT/accuracy.log | cut -c1-600
cp $OUT/acc/fp8_products_accuracy.json $OUT/ 2>/dev/null; rm -rf $OUT/acc
timeout 130 python3 -m mla_dcp.bench --configs C1,C2,R2,R5,C3,C3f8,C5,C5f8 --no-baselines --out $OUT/exact > $OUT/bench_exact.log 2>&1; echo "bench rc=$?"
timeout 80 python3 -m mla_dcp.bench --configs C2,R5,C3f8,C5f8 --no-baselines --fp8-products --out $OUT/fp8p > $OUT/bench_fp8p.log 2>&1; echo "bench fp8p rc=$?"
for d in exact fp8p; do cp $OUT/$d/results.json $OUT/bench_$d.json 2>/dev/null; cp $OUT/$d/results.md $OUT/bench_$d.md 2>/dev/null; rm -rf $OUT/$d; done
grep -E "^\| (C|R)" $OUT/bench_exact.md $OUT/bench_fp8p.md | cut -c1-220
