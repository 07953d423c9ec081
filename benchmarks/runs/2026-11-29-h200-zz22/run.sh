#!/bin/bash
# Run zz22 (thirteenth session, call 4), from the repository root on the H200 with the test wheels in .whl:
# Nsight Compute on the seesaw for C2 (e4m3 cache) at commit 53f266a (conflict-free conversion), with per-instruction source counters
# (stall reasons, shared-memory wavefronts and their excess per SASS line), as text.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
NCU=/usr/local/cuda/bin/ncu
for spec in C2; do
  timeout 120 $NCU --clock-control none -k regex:seesaw --launch-skip 2 -c 1 --set full --import-source yes \
    -o $OUT/ncu_$spec python3 scripts/ncu_gluon.py $spec > $OUT/ncu_$spec.log 2>&1
  echo "ncu $spec rc=$?"
  $NCU -i $OUT/ncu_$spec.ncu-rep --page details > $OUT/ncu_${spec}_details.txt 2>&1
  $NCU -i $OUT/ncu_$spec.ncu-rep --page raw --csv > $OUT/ncu_${spec}_raw.csv 2>&1
  $NCU -i $OUT/ncu_$spec.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncu_${spec}_sass.csv.gz
done
rm -f $OUT/*.ncu-rep; ls -la $OUT
grep -h "Duration\|Excessive\|excessive\|Shared\b" $OUT/ncu_C2_details.txt | head -20
