#!/bin/bash
# Run zz23 (thirteenth session, call 5), from the repository root on the H200 with the test wheels in
# .whl: (1) the rope part converted ahead (benchmarks/candidates/seesaw_rope_ahead.diff, rebased on
# 53f266a) again, now that the conversion's loads are conflict-free: e4m3 edge cases, then C2 and C1
# attention alone beside the committed seesaw; (2) dependent launch (PDL) on vs off on C1, C4, C7,
# one turn each, whole step graphed and eight steps per graph.
set -u
trap 'tar czf $OUT/cand.tgz -C $OUT cand; rm -rf $OUT/cand' EXIT
bash benchmarks/candidates/run_all.sh rope_ahead
O=$OUT/cand
for t in 1; do
  for mode in pdl nopdl; do
    env=""; [ $mode = nopdl ] && env=MLA_DCP_PDL=0
    env PYTHONPATH=.:/tmp/site $env timeout 70 python3 -m mla_dcp.bench --configs C1,C4,C7 --no-baselines \
      --out $O/$mode$t > $O/$mode$t.log 2>&1
  done
done
PYTHONPATH=/tmp/site python3 scripts/ab_summary.py pdl=$O/pdl1 nopdl=$O/nopdl1 | tee $O/pdl_ab.md
PYTHONPATH=/tmp/site python3 scripts/ab_summary.py --timing step_graph_seq_us pdl=$O/pdl1 nopdl=$O/nopdl1 \
  | tee $O/pdl_ab_x8.md
