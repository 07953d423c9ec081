#!/usr/bin/env bash
# GPU call: the batch-invariant merge's tile variants (alone and in the step); random draws after the fp8-products
# fixes; whether a plain custom op's AOTInductor package loads on this torch.
export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind
S=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
for v in default rows d512_w4_c16 d512_w8_c16 d128_w4_c16 d32_w1_c64; do
  timeout 75 python3 benchmarks/probes/merge_variants.py $OUT $v R1,C7,C4,R3,C5 > $OUT/merge_$v.log 2>&1; echo rc=$? >> $OUT/merge_$v.log
  echo "$v $(( $(date +%s) - S ))s" >> $OUT/times.txt
done
timeout 70 python3 scripts/kernel_fuzz.py 55 1 --device cuda > $OUT/kernel_fuzz.log 2>&1; echo rc=$? >> $OUT/kernel_fuzz.log
timeout 70 python3 scripts/kernel_fuzz.py 55 2 --device cuda --wide > $OUT/kernel_fuzz_wide.log 2>&1; echo rc=$? >> $OUT/kernel_fuzz_wide.log
echo "fuzz $(( $(date +%s) - S ))s" >> $OUT/times.txt
timeout 60 python3 build/aoti_plain.py > $OUT/aoti_plain.log 2>&1; echo rc=$? >> $OUT/aoti_plain.log
echo "aoti $(( $(date +%s) - S ))s" >> $OUT/times.txt
python3 - <<'PY'
import json, os, pathlib
out = pathlib.Path(os.environ["OUT"])
for f in sorted(out.glob("merge_*.json")):
    d = json.loads(f.read_text())
    for r in d["rows"]:
        keep = {k: (round(x, 2) if isinstance(x, float) and abs(x) > 1e-3 else x) for k, x in r.items() if k != "case"}
        print(d["variant"], r.get("case"), keep)
PY
for f in $OUT/kernel_fuzz.log $OUT/kernel_fuzz_wide.log; do grep -E "^FAIL|draws|rc=" $f | cut -c1-600; done
grep -E "packaged|loaded|equal|rc=|Segm" $OUT/aoti_plain.log
grep -h "rc=" $OUT/merge_*.log | sort | uniq -c
cat $OUT/env.txt $OUT/times.txt
