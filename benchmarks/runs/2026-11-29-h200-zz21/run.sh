#!/bin/bash
# Run zz21 (thirteenth session, call 3), from the repository root on the H200 with the test wheels in
# .whl: `scripts/gpu_tests.sh` on commit 53f266a's kernels, with the seesaw tests that run zz20 ran
# (33 passed) deselected so the whole sheet fits one 10-minute call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site PATH=$PATH:/usr/local/cuda/bin
sed -i 's/python3 -m pytest -q -m gpu tests /python3 -m pytest -q -m gpu tests -p no:cacheprovider -k "not seesaw" /' scripts/gpu_tests.sh
grep -n "pytest" scripts/gpu_tests.sh
timeout 570 bash scripts/gpu_tests.sh $OUT > $OUT/gpu_tests_sh.log 2>&1; echo "rc=$?"
tail -1 $OUT/gpu_tests.log; grep -h "SUMMARY" $OUT/*check*.log
