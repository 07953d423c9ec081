#!/usr/bin/env bash
# Host time before (HEAD's package) and after (this tree's), bitwise checks, gpu-marked tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
rm -rf gpu_run/base_head && mkdir -p gpu_run/base_head && tar -xf gpu_run/head.tar -C gpu_run/base_head
for tree in gpu_run/base_head .; do
  PYTHONPATH=$PWD/$tree:$PWD/benchmarks/probes timeout 150 python3 benchmarks/probes/host_time.py $OUT/ht_$(basename $tree) C7 C4 R1 R3 C1 > $OUT/ht_$(basename $tree).log 2>&1; echo "host_time $tree rc=$?"
done
paste <(grep " us" $OUT/ht_base_head.log) <(grep " us" $OUT/ht_..log | awk '{print $(NF-1)}')
PYTHONPATH=$PWD timeout 120 python3 gpu_run/plancheck.py C7 C4 R1 R3 C1 C2 C4f8 R6 > $OUT/plancheck.log 2>&1; echo "plancheck rc=$?"; cat $OUT/plancheck.log | grep -v Warn
PYTHONPATH=$PWD timeout 330 python3 -m pytest -q -x -m gpu tests/test_gpu.py tests/test_launch_plans.py tests/test_fast_launch.py > $OUT/gpu_tests.log 2>&1; echo "pytest rc=$?"
tail -n 6 $OUT/gpu_tests.log
