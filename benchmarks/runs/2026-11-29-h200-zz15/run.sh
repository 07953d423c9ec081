#!/bin/bash
# Run zz15 (twelfth session, call 2), from the repository root on the H200 with the test wheels in .whl:
# the gpu-marked tests call 1 (run zz15's README) did not reach, the rope-ahead candidate, and
# Nsight Compute on the seesaw for C2 (e4m3) and C1 (bf16).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "test_narrow_kernel_matches_global_reference and q2-H16-blk16-fp8" > $OUT/gpu_tests_rest.log 2>&1
tail -1 $OUT/gpu_tests_rest.log
trap 'tar czf $OUT/cand.tgz -C $OUT cand; rm -rf $OUT/cand' EXIT
timeout 330 bash benchmarks/candidates/run_all.sh rope_ahead
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
for spec in C2 C1; do
  timeout 70 $NCU --clock-control none -k regex:seesaw --launch-skip 2 -c 1 --set full --import-source yes \
    -o $OUT/ncu_$spec python3 scripts/ncu_gluon.py $spec > $OUT/ncu_$spec.log 2>&1
  echo "ncu $spec rc=$?"
  $NCU -i $OUT/ncu_$spec.ncu-rep --page details > $OUT/ncu_${spec}_details.txt 2>&1
  $NCU -i $OUT/ncu_$spec.ncu-rep --page raw --csv > $OUT/ncu_${spec}_raw.csv 2>&1
done
grep -h "Shared\|Duration\|Issue Slots\|Compute (SM) Throughput\|Registers" $OUT/ncu_C2_details.txt $OUT/ncu_C1_details.txt | head -40
