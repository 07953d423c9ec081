export PYTHONUNBUFFERED=1
set -o pipefail
ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
PYTHONPATH=$ROOT timeout 240 python -m pytest -q -n 8 -m gpu tests/test_fp8_products.py tests/test_batch_invariant.py -p no:cacheprovider 2>&1 | tee $OUT/tests.log | tail -25
for t in 1 2; do
  (cd $ROOT && PYTHONPATH=$ROOT timeout 100 python -m mla_dcp.bench --fp8-products --configs C1,C2,C5f8,R5 --no-baselines --out $OUT/new_t$t > $OUT/new_t$t.log 2>&1 || tail -5 $OUT/new_t$t.log)
  (cd $ROOT/gpu_run/base && PYTHONPATH=$ROOT/gpu_run/base timeout 100 python -m mla_dcp.bench --fp8-products --configs C1,C2,C5f8,R5 --no-baselines --out $OUT/base_t$t > $OUT/base_t$t.log 2>&1 || tail -5 $OUT/base_t$t.log)
done
PYTHONPATH=$ROOT python benchmarks/probes/ab_summary.py new=$OUT/new_t1 base=$OUT/base_t1 new=$OUT/new_t2 base=$OUT/base_t2
