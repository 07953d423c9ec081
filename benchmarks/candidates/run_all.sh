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
e4m3_ab() {  # e4m3_ab NAME DIFF: a seesaw diff's e4m3 edge cases (~2 min), then the whole step beside
  # the committed kernel in three turns on C2 and C1 (~3 min); outputs $O/NAME_c2.log, $O/NAME_ab.md.
  local name=$1
  tree $name $2 || return 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/$name/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=fp8 PROBE_EDGE_SKIP=seesaw \
    PROBE_COUNTS=tuned timeout 200 python3 scripts/seesaw_probe.py $O/${name}_c2 C2 var-seesaw,seesaw \
    > $O/${name}_c2.log 2>&1
  grep -c "ok=True" $O/${name}_c2.log; grep "ok=False" $O/${name}_c2.log | head -5
  grep -v edge $O/${name}_c2.log | tail -6
  for t in 1 2 3; do bench $ROOT base$t C2,C1; bench /tmp/$name $name$t C2,C1; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 $name=$O/${name}1 base=$O/base2 $name=$O/${name}2 \
    base=$O/base3 $name=$O/${name}3 | tee $O/${name}_ab.md
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
rope_ahead)
  # Each warpgroup also converts its next tile's rope part (refilled right after its scores) under
  # its last V product of the pair (eleventh session, not yet run): e4m3 edge cases for the
  # candidate, then C2 and C1 beside the committed seesaw at every segment count (~4 min).
  tree rope seesaw_rope_ahead.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/rope/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=bf16,fp8 PROBE_EDGE_SKIP=seesaw \
    timeout 240 python3 scripts/seesaw_probe.py $O/rope_c2 C2 var-seesaw,seesaw > $O/rope_c2.log 2>&1
  grep -c "ok=True" $O/rope_c2.log; grep "ok=False" $O/rope_c2.log | head -5; grep -v edge $O/rope_c2.log | tail -12
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/rope/mla_dcp/ops/seesaw.py PROBE_EDGE=0 PROBE_COUNTS=tuned \
    timeout 120 python3 scripts/seesaw_probe.py $O/rope_c1 C1 var-seesaw,seesaw > $O/rope_c1.log 2>&1
  grep -v edge $O/rope_c1.log | tail -4
  ;;
conflict_free)
  # The conversion's lanes along rows (twelfth session; run zz19, applied): its e4m3 loads of the latent
  # halves without the 2-way bank conflict of run zz18. e4m3 edge cases (~2 min), then the whole
  # step beside the committed kernel in three turns (C2; C1 must not move).
  e4m3_ab cfree seesaw_conflict_free_convert.diff || exit 1
  ;;
convert_sites)
  # Which conversion chain of C2 is exposed (thirteenth session, not yet run; ~3 min): the committed
  # seesaw with one conversion site dropped at a time (wrong values, time only), against the same
  # kernel loaded as a copy (run zz23: copies read 1-3% faster than the committed module).
  PYTHONPATH=.:/tmp/site timeout 300 python3 scripts/stage_variants.py $O/sites C2 \
    copy,no_convert_ahead,no_convert_other,no_convert_rope,no_convert > $O/sites.log 2>&1
  tail -3 $O/sites.log
  ;;
split_other)
  # The other latent half converted and multiplied in two 128-column pieces, the first without
  # the barrier between its loads and stores (thirteenth session, not yet run; ~5 min): e4m3 edge
  # cases, then the whole step beside the committed kernel in three turns (C2; C1 must not move:
  # its PTX is unchanged).
  e4m3_ab split seesaw_split_other_half.diff || exit 1
  ;;
rope_first)
  # The scores' parts in the order own half, rope, other half (thirteenth session, not yet run;
  # ~8 min): the other half, copied last, gets the rope product's time to land. Both dtypes
  # change: e4m3 edge cases and C2/C1 in three turns, then C6 and C5 in two.
  e4m3_ab rfirst seesaw_rope_first.diff || exit 1
  for t in 1 2; do bench $ROOT bbase$t C6,C5; bench /tmp/rfirst rfirst_b$t C6,C5; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/bbase1 rfirst=$O/rfirst_b1 base=$O/bbase2 \
    rfirst=$O/rfirst_b2 | tee $O/rfirst_bf16_ab.md
  ;;
split_rope_first)
  # Both of the above in one (thirteenth session, not yet run; ~5 min): scores as own half, rope,
  # then the other half in two pieces. For when each wins alone, or to try both in one call.
  e4m3_ab both seesaw_split_rope_first.diff || exit 1
  ;;
scores_three)
  # The three scores candidates above timed side by side, whole step in three turns on C2 and C1 and
  # two on C6 and C5 (fourteenth session; ~8 min, no edge cases: those run for the one that lands).
  tree split seesaw_split_other_half.diff && tree rfirst seesaw_rope_first.diff \
    && tree both seesaw_split_rope_first.diff || exit 1
  for t in 1 2 3; do
    bench $ROOT base$t C2,C1; bench /tmp/split split$t C2,C1; bench /tmp/rfirst rfirst$t C2,C1
    bench /tmp/both both$t C2,C1
  done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 split=$O/split1 rfirst=$O/rfirst1 both=$O/both1 \
    base=$O/base2 split=$O/split2 rfirst=$O/rfirst2 both=$O/both2 base=$O/base3 split=$O/split3 rfirst=$O/rfirst3 \
    both=$O/both3 | tee $O/three_ab.md
  for t in 1 2; do
    bench $ROOT bbase$t C6,C5; bench /tmp/rfirst rfirst_b$t C6,C5; bench /tmp/both both_b$t C6,C5
  done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/bbase1 rfirst=$O/rfirst_b1 both=$O/both_b1 \
    base=$O/bbase2 rfirst=$O/rfirst_b2 both=$O/both_b2 | tee $O/three_bf16_ab.md
  ;;
left_own_last)
  # L no longer converts its own half ahead (its copy goes out only one V product before: run zz31's
  # largest single wait); L's scores take rope, other half, own half (fourteenth session; run zz32:
  # C2 +8%, not kept). e4m3 edge cases, then C2 and C1 beside the committed kernel in three turns.
  e4m3_ab lown seesaw_left_own_last.diff || exit 1
  ;;
q_staging)
  # An e4m3 program's q staging in about two memory round trips instead of one per 64-column chunk
  # (fifteenth session): the two-pass form's e4m3 edge cases, then C2 and C1 (C1's kernels are
  # unchanged: a control) beside the committed kernel and the one-pass form (timing only) in three
  # turns (~8 min).
  tree two seesaw_q_two_pass.diff && tree one seesaw_q_one_pass.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/two/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=fp8 PROBE_EDGE_SKIP=seesaw \
    PROBE_COUNTS=tuned timeout 200 python3 scripts/seesaw_probe.py $O/two_c2 C2 var-seesaw,seesaw > $O/two_c2.log 2>&1
  grep -c "ok=True" $O/two_c2.log; grep "ok=False" $O/two_c2.log | head -5
  grep -v edge $O/two_c2.log | tail -6
  for t in 1 2 3; do bench $ROOT base$t C2,C1; bench /tmp/two two$t C2,C1; bench /tmp/one one$t C2,C1; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 two=$O/two1 one=$O/one1 base=$O/base2 two=$O/two2 \
    one=$O/one2 base=$O/base3 two=$O/two3 one=$O/one3 | tee $O/q_staging_ab.md
  ;;
q_first)
  # Over an e4m3 cache q copied as it is before the KV copies (as for a 16-bit cache), then moved
  # into fp16 in shared memory (fifteenth session; run zz37's timeline: q waited 4.6 us per program
  # behind the KV copies). e4m3 edge cases, then C2 and C1 beside the committed kernel, three turns.
  e4m3_ab qfirst seesaw_q_copied_first.diff || exit 1
  ;;
q_loaded)
  # 16-bit q loaded through registers and stored, not copied with cp.async (fifteenth session): with
  # any cp.async in the kernel, ptxas puts four never-executed LDS before every CTA memory barrier of
  # the loops (bf16 seesaw: 39, narrow: 27; none without). Timing only, whole step, three turns.
  tree qload seesaw_q_loaded_not_copied.diff || exit 1
  for t in 1 2 3; do bench $ROOT base$t C1,C6,C4; bench /tmp/qload qload$t C1,C6,C4; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 qload=$O/qload1 base=$O/base2 qload=$O/qload2 \
    base=$O/base3 qload=$O/qload3 | tee $O/q_loaded_ab.md
  ;;
q_tma)
  # q by TMA in both Gluon kernels, over 16-bit and e4m3 caches alike (fifteenth session; prepared,
  # not run: no device time left). No cp.async is left, so no LDS padding before the loops' CTA
  # barriers (NOTES version 68), and the e4m3 prologue gets version 67's shorter q path. Edge cases
  # on both cache dtypes, then C1, C2, C6, C4 beside the committed kernels in three turns (~9 min:
  # the edge cases alone if the call is short).
  tree qtma seesaw_q_by_tma.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/qtma/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=bf16,fp8 PROBE_EDGE_SKIP=seesaw \
    PROBE_COUNTS=tuned timeout 240 python3 scripts/seesaw_probe.py $O/qtma_edges C2,C1 var-seesaw,seesaw \
    > $O/qtma_edges.log 2>&1
  grep -c "ok=True" $O/qtma_edges.log; grep "ok=False" $O/qtma_edges.log | head -5
  for t in 1 2 3; do bench $ROOT base$t C1,C2,C6,C4; bench /tmp/qtma qtma$t C1,C2,C6,C4; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 qtma=$O/qtma1 base=$O/base2 qtma=$O/qtma2 \
    base=$O/base3 qtma=$O/qtma3 | tee $O/q_tma_ab.md
  ;;
convert_whole)
  # A latent half's in-place conversion loaded and stored in one statement each (sixteenth session):
  # Triton 3.6's barrier pass puts a bar.sync between the four 64-column stores of the committed
  # form (3 per half, 18 per pair loop), which the whole form drops (e4m3 stack 72 -> 120 B, R's pair
  # loop 5 -> 13 LDL); in two 128-column statements, one barrier stays (96 B, 9 LDL). e4m3 edge
  # cases of both (C2), then C2 and C1 beside the committed kernel in three turns (~8 min).
  tree whole seesaw_convert_whole.diff && tree halves seesaw_convert_halves.diff || exit 1
  PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/whole/mla_dcp/ops/seesaw.py \
    SEESAW_VARIANT2=/tmp/halves/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=fp8 PROBE_EDGE_SKIP=seesaw \
    PROBE_COUNTS=tuned timeout 240 python3 scripts/seesaw_probe.py $O/convert_c2 C2 var-seesaw,var2-seesaw,seesaw \
    > $O/convert_c2.log 2>&1
  grep -c "ok=True" $O/convert_c2.log; grep "ok=False" $O/convert_c2.log | head -5
  grep -v edge $O/convert_c2.log | tail -8
  for t in 1 2 3; do bench $ROOT base$t C2,C1; bench /tmp/whole whole$t C2,C1; bench /tmp/halves halves$t C2,C1; done
  PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/base1 whole=$O/whole1 halves=$O/halves1 \
    base=$O/base2 whole=$O/whole2 halves=$O/halves2 base=$O/base3 whole=$O/whole3 halves=$O/halves3 \
    | tee $O/convert_ab.md
  ;;
convert_low_first)
  # A latent half converted in two passes (sixteenth session, after run zz43): columns 0-127 loaded
  # and stored first (their fp16 blocks lie below the e4m3 copy), then 128-255 loaded, a barrier,
  # stored. Two 64-column values live at a time instead of four: e4m3 stack 72 -> 32 B, LDL in
  # the pair loops 5 + 5 -> 1 + 0 (three barrier-pass bar.syncs more per pair loop). e4m3 edge
  # cases, then C2 and C1 beside the committed kernel in three turns (~4 min).
  e4m3_ab lowfirst seesaw_convert_low_first.diff || exit 1
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
