#!/bin/bash
# Run zz39 (fifteenth session, call 7), from the repository root on the H200 with the test wheels
# in .whl, at cbce178: C2's timeline (scripts/seesaw_timeline.py) for the committed seesaw and for
# benchmarks/candidates/seesaw_q_copied_first.diff (run zz38: 4 us slower), in turns, to see which
# phase the candidate lengthened.
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
rm -rf /tmp/qfirst && mkdir -p /tmp/qfirst && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C /tmp/qfirst
(cd /tmp/qfirst && git apply benchmarks/candidates/seesaw_q_copied_first.diff) || exit 1
for t in 1 2; do
  timeout 100 python3 scripts/seesaw_timeline.py $O/tl_base$t C2 > $O/tl_base$t.log 2>&1
  (cd /tmp/qfirst && PYTHONPATH=.:/tmp/site timeout 100 python3 scripts/seesaw_timeline.py $O/tl_qfirst$t C2) \
    > $O/tl_qfirst$t.log 2>&1
  rm -f $O/tl_*/stamps_*.pt $O/tl_*/seesaw_stamped.py
done
grep -h "graph_us" -A8 $O/tl_base1/seesaw_timeline.json | head -3; date +%T
