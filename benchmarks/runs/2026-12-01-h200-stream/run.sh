#!/usr/bin/env bash
# The stream schedule's first GPU run: gpu-marked tests with MLA_DCP_STREAM=1 (and the new stream
# test without it), then the benchmark in turns without and with --stream.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# usage: run17.sh tests | bench   (two calls: each fits the 600 s limit)
if [ "${1:-tests}" = tests ]; then
MLA_DCP_STREAM=1 timeout 420 python3 -m pytest -q -rf -n 8 -m gpu tests -p no:cacheprovider > $OUT/gpu_tests_stream.log 2>&1
echo "tests (stream) rc=$?"; grep -E "^FAILED|passed|failed|error" $OUT/gpu_tests_stream.log | tail -n 12
exit 0
fi
cfgs=R3,R3u,C4,C7,R6,R6u,C4f8
for turn in chunk1 stream1 chunk2 stream2; do
  flag=""; [ ${turn%?} = stream ] && flag="--stream"
  timeout 130 python3 -m mla_dcp.bench --configs $cfgs --no-baselines $flag --out $OUT/$turn > $OUT/bench_$turn.log 2>&1
  echo "$turn rc=$?"; cp $OUT/$turn/results.json $OUT/bench_$turn.json 2>/dev/null; cp $OUT/$turn/results.md $OUT/bench_$turn.md 2>/dev/null; rm -rf $OUT/$turn
  grep -E "^\| (C|R)" $OUT/bench_$turn.md | cut -c1-160
done
