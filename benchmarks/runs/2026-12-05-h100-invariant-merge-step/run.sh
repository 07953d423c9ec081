#!/usr/bin/env bash
# GPU call: the batch-invariant merge tile in the step (committed vs the tile before vs the default mode),
# the fuzz draw that failed with its new budget, more wide draws, a plain custom op's AOTI package.
export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind
S=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/env.txt
timeout 40 python3 scripts/kernel_fuzz.py --only 924856009 --device cuda --wide > $OUT/fuzz_only.log 2>&1; echo rc=$? >> $OUT/fuzz_only.log
for v in default rows d512_w4_c64; do
  timeout 80 python3 benchmarks/probes/merge_variants.py $OUT $v C7,R1,C4,R4 > $OUT/merge_$v.log 2>&1; echo rc=$? >> $OUT/merge_$v.log
  echo "$v $(( $(date +%s) - S ))s" >> $OUT/times.txt
done
timeout 65 python3 scripts/kernel_fuzz.py 55 3 --device cuda --wide > $OUT/fuzz_wide.log 2>&1; echo rc=$? >> $OUT/fuzz_wide.log
timeout 90 python3 build/aoti_plain.py > $OUT/aoti_plain.log 2>&1; echo rc=$? >> $OUT/aoti_plain.log
echo "end $(( $(date +%s) - S ))s" >> $OUT/times.txt
cat $OUT/merge_*.log | cut -c1-260
grep -hE "^FAIL|draws|rc=" $OUT/fuzz_only.log $OUT/fuzz_wide.log | cut -c1-500
grep -E "packaged|loaded|equal|rc=|Segm" $OUT/aoti_plain.log
cat $OUT/env.txt $OUT/times.txt
rm -f $OUT/merge_*.json
