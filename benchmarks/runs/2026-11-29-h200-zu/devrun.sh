#!/bin/bash
# Ninth session, call 1: A/B in turns (base = HEAD ad0db0e, ids = base without the read-ahead page ids,
# new = staged epilogue stores), timelines, GPU tests of the changed epilogue.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
O=/tmp/o; mkdir -p $O; trap 'tar czf $OUT/all.tgz -C $O .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt
CFG=${CFG:-C1,C5,C6}
for t in 1 2 3; do
  (cd probe_base && timeout 120 python3 -m mla_dcp.bench --configs $CFG --no-baselines --out $O/base$t) > $O/base$t.log 2>&1
  (cd probe_ids && timeout 120 python3 -m mla_dcp.bench --configs $CFG --no-baselines --out $O/ids$t) > $O/ids$t.log 2>&1
  timeout 120 python3 -m mla_dcp.bench --configs $CFG --no-baselines --out $O/new$t > $O/new$t.log 2>&1
  echo "turn $t done $SECONDS s"
done
python3 scripts/ab_summary.py base=$O/base1 ids=$O/ids1 new=$O/new1 base=$O/base2 ids=$O/ids2 new=$O/new2 \
  base=$O/base3 ids=$O/ids3 new=$O/new3 | tee $O/ab.md
timeout 150 python3 scripts/seesaw_timeline.py $O/tl C6,C1,C4@narrow,C4:1@narrow > $O/tl.log 2>&1; tail -40 $O/tl.log
echo "timeline done $SECONDS s"
timeout ${TEST_S:-200} python3 -m pytest -q -m gpu tests/test_gpu.py -x \
  -k "seesaw or one_segment or verify_matches or static_bound or capture_change" > $O/tests.log 2>&1
tail -5 $O/tests.log; echo "tests done $SECONDS s"
