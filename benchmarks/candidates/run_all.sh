#!/bin/bash
# The ninth session's prepared candidates, measured in one device call (~20 min; split it where the
# per-call limit is 10 min: each block below runs alone). From the repository root on the GPU machine,
# with the test wheels carried in .whl (device README). Everything lands under $OUT/cand.
# Each candidate applies to a scratch copy of the tree, so the working tree stays at HEAD.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
O=$OUT/cand; mkdir -p $O
ROOT=$PWD
tree() {   # tree NAME DIFF...: a scratch copy of the tree in /tmp/NAME with the diffs applied
  local name=$1; shift
  # The working tree as copied to the machine (its .git need not hold the latest commit).
  rm -rf /tmp/$name && mkdir -p /tmp/$name && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C /tmp/$name \
    || return 1
  for d in "$@"; do (cd /tmp/$name && git apply $ROOT/benchmarks/candidates/$d) || return 1; done
}
bench() {  # bench TREE OUTNAME CONFIGS [ENV=...]
  (cd $1 && env PYTHONPATH=.:/tmp/site ${4:-} timeout 120 python3 -m mla_dcp.bench --configs $3 --no-baselines --out $O/$2) \
    > $O/$2.log 2>&1
}
case "${1:-all}" in
producer|all)
  tree producer producer_seesaw.diff || exit 1
  (cd /tmp/producer && PYTHONPATH=.:/tmp/site timeout 330 python3 -m pytest -q -m gpu tests/test_gpu.py \
    -k "seesaw or one_segment or verify_matches or static_bound or capture_change") > $O/producer_tests.log 2>&1
  tail -2 $O/producer_tests.log
  for t in 1 2 3; do bench $ROOT base$t C1,C5,C6; bench /tmp/producer producer$t C1,C5,C6; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 producer=$O/producer1 base=$O/base2 \
    producer=$O/producer2 base=$O/base3 producer=$O/producer3 | tee $O/producer_ab.md
  ;;&
halves|all)
  PYTHONPATH=.:/tmp/site NARROW_VARIANT=benchmarks/candidates/halves.py PROBE_EDGE_KV=bf16,fp8 PROBE_EDGE_SKIP=narrow32 \
    timeout 500 python3 scripts/seesaw_probe.py $O/halves C2 var-narrow64,narrow32 > $O/halves.log 2>&1
  grep -c "ok=True" $O/halves.log; grep "ok=False\|ns=" $O/halves.log | head -20
  ;;&
stages|all)
  PYTHONPATH=.:/tmp/site timeout 300 python3 scripts/stage_variants.py $O/stages C1,C6,C4@narrow > $O/stages.log 2>&1
  tail -4 $O/stages.log
  ;;&
seesaw_e4m3|all)
  # Checked against verify's own kernels on bf16 and e4m3 edge cases, then C2 (against the narrow kernel, the
  # production path) and C1 (against the committed seesaw). The variant is loaded by path from a scratch tree.
  tree sse seesaw_e4m3.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/sse/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=bf16,fp8 \
    timeout 300 python3 scripts/seesaw_probe.py $O/sse_c2 C2 var-seesaw > $O/sse_c2.log 2>&1
  grep -c "ok=True" $O/sse_c2.log; grep "ok=False" $O/sse_c2.log | head -5; grep -v edge $O/sse_c2.log | tail -8
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/sse/mla_dcp/ops/seesaw.py PROBE_EDGE=0 \
    timeout 150 python3 scripts/seesaw_probe.py $O/sse_c1 C1 var-seesaw,seesaw > $O/sse_c1.log 2>&1
  tail -14 $O/sse_c1.log
  ;;&
seesaw_e4m3_landing)
  # Only once seesaw_e4m3 has won: both diffs applied (the production dispatch sends e4m3 caches to the
  # seesaw), the GPU tests that touch the Gluon kernels, then C1 and C2 in turns against HEAD.
  tree ssel seesaw_e4m3.diff seesaw_e4m3_integration.diff || exit 1
  (cd /tmp/ssel && PYTHONPATH=.:/tmp/site timeout 330 python3 -m pytest -q -m gpu tests/test_gpu.py \
    -k "seesaw or narrow or one_segment or verify_matches or static_bound or capture_change") > $O/ssel_tests.log 2>&1
  tail -2 $O/ssel_tests.log
  for t in 1 2 3; do bench $ROOT base$t C1,C2; bench /tmp/ssel ssel$t C1,C2; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 ssel=$O/ssel1 base=$O/base2 ssel=$O/ssel2 \
    base=$O/base3 ssel=$O/ssel3 | tee $O/ssel_ab.md
  ;;
convert_ahead)
  # Each warpgroup converts its next tile's own e4m3 half under its last V product of the pair
  # (eleventh session). Checked on bf16 and e4m3 edge cases against verify's kernels, then C2 and C1
  # beside the committed seesaw; then what C2's conversions cost in the committed kernel (no_convert).
  tree ahead seesaw_convert_ahead.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/ahead/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=bf16,fp8 \
    timeout 240 python3 scripts/seesaw_probe.py $O/ahead_c2 C2 var-seesaw,seesaw > $O/ahead_c2.log 2>&1
  grep -c "ok=True" $O/ahead_c2.log; grep "ok=False" $O/ahead_c2.log | head -5; grep -v edge $O/ahead_c2.log | tail -12
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/ahead/mla_dcp/ops/seesaw.py PROBE_EDGE=0 \
    timeout 120 python3 scripts/seesaw_probe.py $O/ahead_c1 C1 var-seesaw,seesaw > $O/ahead_c1.log 2>&1
  grep -v edge $O/ahead_c1.log | tail -14
  PYTHONPATH=.:/tmp/site timeout 120 python3 scripts/stage_variants.py $O/noconv C2 no_convert > $O/noconv.log 2>&1
  tail -2 $O/noconv.log
  ;;
late|all)
  tree late late_launch_dependents.diff || exit 1
  for t in 1 2 3; do
    bench $ROOT pdl$t C1,C3,C5; bench /tmp/late late$t C1,C3,C5; bench $ROOT nopdl$t C1,C3,C5 MLA_DCP_PDL=0
  done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py pdl=$O/pdl1 late=$O/late1 nopdl=$O/nopdl1 pdl=$O/pdl2 \
    late=$O/late2 nopdl=$O/nopdl2 pdl=$O/pdl3 late=$O/late3 nopdl=$O/nopdl3 | tee $O/late_ab.md
  ;;
esac
