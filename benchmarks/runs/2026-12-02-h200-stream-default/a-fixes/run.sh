#!/usr/bin/env bash
# Stream narrow kernel with its buffers per piece: tests, per-kernel profile chunk vs stream, bench in turns.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
MLA_DCP_STREAM=1 timeout 260 python3 -m pytest -q -rf -n 8 -m gpu tests/test_gpu.py tests/test_poisoned.py tests/test_noncausal.py -k "narrow or stream or poison or causal" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^FAILED|passed|failed|error" $OUT/tests.log | tail -n 5
specs=$(cat gpu_run/specs.txt)
MLA_DCP_PDL=0 timeout 100 python3 gpu_run/prof2.py chunk $specs > $OUT/prof_chunk.json 2>$OUT/prof_chunk.err; echo "prof chunk rc=$?"
MLA_DCP_STREAM=1 MLA_DCP_PDL=0 timeout 100 python3 gpu_run/prof2.py stream $specs > $OUT/prof_stream.json 2>$OUT/prof_stream.err; echo "prof stream rc=$?"
python3 - <<'PY'
import json, os
for l in ("chunk", "stream"):
    try:
        d = json.load(open(os.environ["OUT"] + f"/prof_{l}.json"))
    except Exception as e:
        print(l, "no json", e); continue
    for k, v in d.items():
        if k != "label": print(l, k, v)
PY
cfgs=R3,R3u,C4,C7,R6,C4f8
for turn in chunk1 stream1 chunk2 stream2; do
  flag=""; [ ${turn%?} = stream ] && flag="--stream"
  timeout 130 python3 -m mla_dcp.bench --configs $cfgs --no-baselines $flag --out $OUT/$turn > $OUT/bench_$turn.log 2>&1
  echo "$turn rc=$?"; cp $OUT/$turn/results.json $OUT/bench_$turn.json 2>/dev/null; rm -rf $OUT/$turn
  python3 -c "
import json,sys; d=json.load(open('$OUT/bench_$turn.json'))
for r in d['rows']: print('$turn', r['config'], 'graph %.1f attn %.1f view %.1f x8 %.1f floor %.1f' % (r['step_graph_us'], r['attention_graph_us'], r['view_graph_us'], r['step_graph_seq_us'], r['floor_us']))
"
done
