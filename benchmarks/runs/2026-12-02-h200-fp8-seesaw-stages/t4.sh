#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for v in base no_transpose no_rope; do timeout 75 python3 gpu_run/ab9.py $v 2>&1 | grep -v Warn | tail -3 | tee -a $OUT/ab9.log; done
