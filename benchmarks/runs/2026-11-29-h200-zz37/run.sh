#!/bin/bash
# Run zz37 (fifteenth session, call 5), from the repository root on the H200 with the test wheels
# in .whl, at c71dd85: where a C2 (e4m3) seesaw program's time goes beside C1's (%globaltimer
# stamps, scripts/seesaw_timeline.py; first time on C2), and racecheck on the e4m3 narrow kernel
# (its q staging changed in 0c0f7f6).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 240 python3 scripts/seesaw_timeline.py $O/timeline C2,C1 > $O/timeline.log 2>&1
grep -v "^ " $O/timeline.log | tail -4; date +%T
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize_one.py fp8 narrow 2>&1 \
  | tail -n 5 > $O/racecheck_fp8_narrow.log
tail -1 $O/racecheck_fp8_narrow.log; date +%T
