#!/bin/bash
# seesaw_converter.diff in one device call (eleventh session): correctness on bf16 and e4m3 edge
# cases and C2's time beside the committed seesaw; where it is correct and >= 2% faster, the whole
# benchmark on it (a candidate record) and the GPU tests that touch the seesaw. From the repository
# root on the GPU machine, test wheels in .whl; everything lands under $OUT/conv.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
O=$OUT/conv; mkdir -p $O
ROOT=$PWD
rm -rf /tmp/conv && mkdir -p /tmp/conv && tar -c --exclude=./.git --exclude=./.whl . | tar -x -C /tmp/conv || exit 1
(cd /tmp/conv && git apply $ROOT/benchmarks/candidates/seesaw_converter.diff) || exit 1
PYTHONPATH=.:/tmp/site SEESAW_VARIANT=/tmp/conv/mla_dcp/ops/seesaw.py PROBE_EDGE_KV=bf16,fp8 PROBE_EDGE_SKIP=seesaw \
  PROBE_COUNTS=tuned timeout 220 python3 scripts/seesaw_probe.py $O/probe C2 var-seesaw,seesaw > $O/probe.log 2>&1
grep -c "ok=True" $O/probe.log; grep "ok=False" $O/probe.log | head -5; grep -v edge $O/probe.log | tail -6
python3 - $O/probe/seesaw_probe.json <<'PY' || exit 0
import json, sys
d = json.load(open(sys.argv[1]))
row = d["rows"][0]
var, base = row["var-seesaw"][str(row["ns_tuned"])], row["seesaw"][str(row["ns_tuned"])]
print(f"C2 converter {var:.1f} us, committed {base:.1f} us, all_ok={d['all_ok']}")
sys.exit(0 if d["all_ok"] and var < 0.98 * base else 1)
PY
cd /tmp/conv
PYTHONPATH=.:/tmp/site timeout 150 python3 -m mla_dcp.bench --repeat 3 --out $O/bench > $O/bench.log 2>&1
grep "^| C" $O/bench.log
PYTHONPATH=.:/tmp/site timeout 170 python3 -m pytest -q -m gpu tests/test_gpu.py -k "seesaw or verify_matches" > $O/tests.log 2>&1
tail -2 $O/tests.log
