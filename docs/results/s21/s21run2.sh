#!/usr/bin/env bash
# Session 21, device call 2, main at b4acca0 (kernels as 306201d): the exponent instructions'
# throughput (bench/micro/mufu_ex2.cu, nvcc), then issue 4's D=64 grid beside FlashInfer FA2 and
# torch SDPA cuDNN after the quick verify (gpu-suite), then the full verify (210 widest-tile cases).
set -uo pipefail
export PYTHONUNBUFFERED=1
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
nvcc -arch=sm_90a -O3 -o /tmp/mufu_ex2 bench/micro/mufu_ex2.cu > $OUT/mufu.txt 2>&1 && /tmp/mufu_ex2 >> $OUT/mufu.txt 2>&1; cat $OUT/mufu.txt
cuobjdump -sass /tmp/mufu_ex2 2>/dev/null | grep -E "MUFU|FFMA" | awk '{print $2}' | sort | uniq -c | head >> $OUT/mufu.txt; tail -6 $OUT/mufu.txt
echo "micro ($(( $(date +%s) - T0 )) s)"
timeout 330 bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - T0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096|s8192|f16qk|softcap" $OUT/suite/section-prefill.md | head -20
export ATTNFORGE_CACHE_DIR=/tmp/afcache
timeout 190 $B/attnforge verify --backend cuda --suite full --seed 2103 > $OUT/verify-full.log 2>&1; echo "verify full exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-full.log)"
head -1 $OUT/verify-full.log; grep -E "^FAIL|^error|^stopped" $OUT/verify-full.log | head -12
echo "total $(( $(date +%s) - T0 )) s"
