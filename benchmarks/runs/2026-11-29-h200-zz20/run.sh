#!/bin/bash
# Run zz20 (thirteenth session, call 2), from the repository root on the H200 with the test wheels
# in .whl: the seesaw's GPU tests and compute-sanitizer memcheck on the e4m3 seesaw at 53f266a (the
# conflict-free conversion), then the record (`python -m mla_dcp.bench --repeat 3`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site
O=$OUT; date +%T
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -k seesaw > $O/tests.log 2>&1
tail -1 $O/tests.log; date +%T
for page in "" block=16; do
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize_one.py fp8 $page 2>&1 \
    | tail -n 5 > $O/memcheck_fp8${page:+_$page}.log
  tail -1 $O/memcheck_fp8${page:+_$page}.log
done; date +%T
timeout 280 python3 -m mla_dcp.bench --repeat 3 --out $O/bench > $O/bench.log 2>&1
tail -12 $O/bench.log; date +%T
