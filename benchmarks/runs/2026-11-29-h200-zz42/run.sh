#!/bin/bash
# Run zz42 (sixteenth session, call 2), from the repository root on the H200 with the test wheels
# in .whl, at main's head after the fifteenth session's second-read mends (0786f1b: shared
# _row_absmax/_to_fp16; 467a406: test_seesaw's build helper): every gpu-marked test, one pass.
set -u
. benchmarks/runs/device_env.sh
O=$OUT; date +%T
timeout 540 python3 -m pytest -q -m gpu tests -p no:cacheprovider > $O/gpu_tests.log 2>&1
tail -3 $O/gpu_tests.log; date +%T
