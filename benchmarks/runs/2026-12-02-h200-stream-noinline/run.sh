#!/usr/bin/env bash
# The stream build with its piece as a non-inlined function (no hoisting across pieces) vs the committed builds.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks/probes
timeout 60 python3 gpu_run/tl_stream.py chunk C4,R3u,R3 > $OUT/tl_chunk.log 2>&1; echo "chunk rc=$?"
MLA_DCP_STREAM=1 timeout 60 python3 gpu_run/tl_stream.py stream C4,R3u,R3 > $OUT/tl_stream.log 2>&1; echo "stream rc=$?"
MLA_DCP_STREAM=1 timeout 70 python3 gpu_run/tl_stream.py noinline C4,R3u,R3 narrow_noinline > $OUT/tl_noinline.log 2>&1; echo "noinline rc=$?"
for f in chunk stream noinline; do grep -v '^{' $OUT/tl_$f.log | grep -v Warn | tail -n 6 | cut -c1-330; done
