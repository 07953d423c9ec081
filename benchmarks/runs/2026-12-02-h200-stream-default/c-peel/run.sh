#!/usr/bin/env bash
# Narrow stream build: committed loop vs first piece peeled; chunked reference. Timeline + graph.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks/probes
for turn in 1 2; do
timeout 100 python3 gpu_run/tl_stream.py chunk C4,R3u,R3 > $OUT/tl_chunk$turn.log 2>&1; echo "chunk rc=$?"
MLA_DCP_STREAM=1 timeout 100 python3 gpu_run/tl_stream.py stream C4,R3u,R3 > $OUT/tl_stream$turn.log 2>&1; echo "stream rc=$?"
MLA_DCP_STREAM=1 timeout 100 python3 gpu_run/tl_stream.py peel C4,R3u,R3 narrow_peel > $OUT/tl_peel$turn.log 2>&1; echo "peel rc=$?"
for f in chunk stream peel; do grep -v '^{' $OUT/tl_$f$turn.log | tail -n 4 | cut -c1-400; done
done
