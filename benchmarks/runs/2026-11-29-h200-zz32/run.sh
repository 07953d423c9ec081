#!/bin/bash
# Run zz32 (fourteenth session, call 9), from the repository root on the H200 with the test wheels in .whl:
# benchmarks/candidates/seesaw_left_own_last.diff timed beside the committed kernel, whole step on C2
# and C1 in two turns (timing only: the session's device time allowed no more; the edge cases are
# run_all.sh left_own_last's).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
rm -rf /tmp/lown && mkdir -p /tmp/lown && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C /tmp/lown
(cd /tmp/lown && git apply $OLDPWD/benchmarks/candidates/seesaw_left_own_last.diff) || exit 1
for t in 1 2; do
  timeout 100 python3 -m mla_dcp.bench --configs C2,C1 --no-baselines --out $O/base$t > $O/base$t.log 2>&1
  (cd /tmp/lown && timeout 100 python3 -m mla_dcp.bench --configs C2,C1 --no-baselines --out $O/lown$t) > $O/lown$t.log 2>&1
done
python3 scripts/ab_summary.py base=$O/base1 lown=$O/lown1 base=$O/base2 lown=$O/lown2 | tee $O/lown_ab.md
date +%T
