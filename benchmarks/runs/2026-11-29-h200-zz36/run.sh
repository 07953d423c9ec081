#!/bin/bash
# Run zz36 (fifteenth session, call 4), from the repository root on the H200 with the test wheels
# in .whl, at 0c0f7f6: every gpu-marked test but the seesaw's (run zz35 ran those).
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider -k "not seesaw" > $O/gpu_tests.log 2>&1
tail -1 $O/gpu_tests.log; date +%T
