#!/bin/bash
# Run zz16 (twelfth session, call 3), from the repository root on the H200 with the test wheels in .whl:
# the seesaw with q's wgmma descriptors rebuilt every pair (the working tree) against the committed one
# (.scratch/seesaw_head.py = HEAD's mla_dcp/ops/seesaw.py), and the rope-ahead candidate on top.
# Before copying the tree to the GPU machine (its .git may be stale):
#   mkdir -p .scratch && git show 42c65ee:mla_dcp/ops/seesaw.py > .scratch/seesaw_head.py
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
O=$OUT; R=$PWD
copy() { rm -rf $1 && mkdir -p $1 && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C $1; }
copy /tmp/base && cp .scratch/seesaw_head.py /tmp/base/mla_dcp/ops/seesaw.py
copy /tmp/rope && (cd /tmp/rope && git apply $R/benchmarks/candidates/seesaw_rope_ahead.diff) || exit 1
date +%T
PYTHONPATH=.:/tmp/site timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "seesaw or one_segment or verify_matches or static_bound or capture_change" > $O/tests.log 2>&1
tail -1 $O/tests.log; date +%T
bench() {  # bench TREE OUTNAME CONFIGS
  (cd $1 && PYTHONPATH=.:/tmp/site timeout 100 python3 -m mla_dcp.bench --configs $3 --no-baselines --out $O/b/$2) \
    > $O/b/$2.log 2>&1; date +%T
}
mkdir -p $O/b
for t in 1 2; do bench /tmp/base base$t C1,C2,C6; bench $R new$t C1,C2,C6; bench /tmp/rope rope$t C2; done
PYTHONPATH=/tmp/site python3 scripts/ab_summary.py base=$O/b/base1 new=$O/b/new1 rope=$O/b/rope1 \
  base=$O/b/base2 new=$O/b/new2 rope=$O/b/rope2 | tee $O/ab.md
tar czf $O/b.tgz -C $O b && rm -rf $O/b
