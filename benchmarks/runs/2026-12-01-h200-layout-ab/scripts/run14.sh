#!/usr/bin/env bash
# after the aggregates and the stamps hook: gpu tests, host time of base (dafc499) vs this tree in turns, timeline probe
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
for turn in new1 base1 new2 base2; do
  tree=${turn%?}; if [ $tree = base ]; then p=gpu_run/base; else p=$PWD; fi
  PYTHONPATH=$p timeout 60 python3 benchmarks/probes/host_time.py $OUT/host_$turn C7 C4 > $OUT/host_$turn.log 2>&1; cat $OUT/host_$turn.log | tr '\n' ';'; echo " <- $turn"
  cp $OUT/host_$turn/host_time.json $OUT/host_$turn.json 2>/dev/null; rm -rf $OUT/host_$turn
done
PYTHONPATH=$PWD timeout 90 python3 benchmarks/probes/seesaw_timeline.py $OUT/tl C1,C4@narrow > $OUT/timeline.log 2>&1; echo "timeline rc=$?"; grep -A3 '"graph_us"' $OUT/timeline.log | head -20
cp $OUT/tl/seesaw_timeline.json $OUT/ 2>/dev/null; rm -rf $OUT/tl
PYTHONPATH=$PWD timeout 330 python3 -m pytest -q -rf -n 8 -m gpu tests/test_gpu.py tests/test_batch_invariant.py tests/test_noncausal.py tests/test_poisoned.py tests/test_hf.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"; tail -n 4 $OUT/gpu_tests.log
