#!/bin/bash
# Run zz17 (twelfth session, call 4), from the repository root on the H200 with the test wheels in .whl:
# every shared-memory wgmma operand of the pair loop rebuilt each pair (the working tree) against q's
# alone (commit e2fadbb: .scratch/seesaw_q_only.py), two turns; the seesaw GPU tests on the working
# tree; then the record (`python -m mla_dcp.bench --repeat 3`) from whichever tree was faster.
# Before copying the tree to the GPU machine (its .git may be stale):
#   mkdir -p .scratch && git show e2fadbb:mla_dcp/ops/seesaw.py > .scratch/seesaw_q_only.py
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
O=$OUT; R=$PWD
rm -rf /tmp/qonly && mkdir -p /tmp/qonly && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C /tmp/qonly
cp .scratch/seesaw_q_only.py /tmp/qonly/mla_dcp/ops/seesaw.py
bench() {  # bench TREE OUTNAME CONFIGS
  (cd $1 && PYTHONPATH=.:/tmp/site timeout 100 python3 -m mla_dcp.bench --configs $3 --no-baselines --out $O/b/$2) \
    > $O/b/$2.log 2>&1; date +%T
}
mkdir -p $O/b; date +%T
for t in 1 2; do bench /tmp/qonly qonly$t C1,C2,C6,C5; bench $R all$t C1,C2,C6,C5; done
PYTHONPATH=/tmp/site python3 scripts/ab_summary.py qonly=$O/b/qonly1 all=$O/b/all1 qonly=$O/b/qonly2 all=$O/b/all2 \
  | tee $O/ab.md
# The faster tree (sum of the graphed steps' medians over the four configs) makes the record.
winner=$(python3 - $O/b <<'PY'
import json, statistics, sys, pathlib
d = pathlib.Path(sys.argv[1])
def total(label):
    runs = [json.loads((d / f"{label}{t}" / "results.json").read_text())["rows"] for t in (1, 2)]
    return sum(statistics.median(r[i]["step_graph_us"] for r in runs) for i in range(len(runs[0])))
print(min(("all", "qonly"), key=total))
PY
)
echo "record from: $winner" | tee $O/winner.txt  # all, in run zz17
tar czf $O/b.tgz -C $O b && rm -rf $O/b
PYTHONPATH=.:/tmp/site timeout 150 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k seesaw \
  > $O/tests.log 2>&1
tail -1 $O/tests.log; date +%T
tree=$R; [ "$winner" = qonly ] && tree=/tmp/qonly
(cd $tree && PYTHONPATH=.:/tmp/site python3 -m mla_dcp.bench --repeat 3 --out $O/bench) > $O/bench.log 2>&1
tail -12 $O/bench.log; date +%T
