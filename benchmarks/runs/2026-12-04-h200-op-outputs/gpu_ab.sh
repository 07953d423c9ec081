#!/bin/bash
# A/B of two trees' eager host time (alternating processes) and the aliasing fix's negative control.
set -x
ROOT=$PWD
export PYTHONPATH=$ROOT
timeout 200 python -m pytest -q -x tests/test_gpu.py -k "share_no_storage or native_plans_replay" -p no:cacheprovider 2>&1 | tail -3
# Negative control: the launchers' plans without separate outputs.
rm -rf /tmp/nofix && cp -r $ROOT /tmp/nofix && sed -i 's/self.make_native(inputs + outputs, len(inputs), separate=True)/self.make_native(inputs + outputs, len(inputs))/' /tmp/nofix/mla_dcp/ops/fast_launch.py
grep -c "separate=True" /tmp/nofix/mla_dcp/ops/fast_launch.py
(cd /tmp/nofix && PYTHONPATH=/tmp/nofix timeout 150 python -m pytest -q -x tests/test_gpu.py -k "share_no_storage" -p no:cacheprovider 2>&1 | grep -E "assert|passed|failed|Error" | head -8)
cd $ROOT/benchmarks/probes
for turn in 1 2; do
  if [ $turn = 1 ]; then order="base new"; else order="new base"; fi
  for tree in $order; do
    if [ $tree = base ]; then P=$ROOT/_base; else P=$ROOT; fi
    PYTHONPATH=$P timeout 120 python host_time.py $OUT/${tree}_$turn C7 2>&1 | grep " us" | sed "s/^/$tree $turn /"
  done
done
