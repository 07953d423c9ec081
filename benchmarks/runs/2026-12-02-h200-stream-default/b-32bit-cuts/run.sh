#!/usr/bin/env bash
# 32-bit stream cuts + per-request tiles: GPU stream tests, narrow timeline chunk vs stream, bench in turns.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 170 python3 -m pytest -q -rf -n 8 -m gpu tests/test_gpu.py -k "stream" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^FAILED|passed|failed|error" $OUT/tests.log | tail -n 5
PYTHONPATH=$PWD:$PWD/benchmarks/probes timeout 100 python3 gpu_run/tl_stream.py chunk C4,R3u,R3 > $OUT/tl.log 2>&1; echo "tl chunk rc=$?"
MLA_DCP_STREAM=1 PYTHONPATH=$PWD:$PWD/benchmarks/probes timeout 100 python3 gpu_run/tl_stream.py stream C4,R3u,R3 >> $OUT/tl.log 2>&1; echo "tl stream rc=$?"
grep -v '^{' $OUT/tl.log | tail -n 12
cfgs=C7,C4,R3u,R3
for turn in chunk1 stream1 chunk2 stream2; do
  flag=""; [ ${turn%?} = stream ] && flag="--stream"
  timeout 110 python3 -m mla_dcp.bench --configs $cfgs --no-baselines $flag --out $OUT/$turn > /dev/null 2>$OUT/err_$turn.txt
  echo "$turn rc=$?"; cp $OUT/$turn/results.json $OUT/bench_$turn.json 2>/dev/null; rm -rf $OUT/$turn; tail -n 3 $OUT/err_$turn.txt; rm -f $OUT/err_$turn.txt
  python3 -c "
import json,sys; d=json.load(open('$OUT/bench_$turn.json'))
print('$turn ceilings', d.get('ceilings'))
for r in d['rows']: print('$turn', r['config'], 'graph %.1f attn %.1f view %.1f x8 %.1f floor %.1f' % (r['step_graph_us'], r['attention_graph_us'], r['view_graph_us'], r['step_graph_seq_us'], r['floor_us']))
"
done
