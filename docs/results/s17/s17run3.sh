#!/usr/bin/env bash
# Session 17, device call 3. tma2 = tma (run 2) plus the paged cache's whole tiles by the tensor
# memory accelerator (one box per page, 4-D tensor maps). Quick verify; ABBA main vs tma2 on the
# paged shapes (decode: controls, unchanged kernels) and two ragged ones; then gpu-suite: full
# verify and the head-dim-128 list beside FlashInfer FA2 and torch SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 90 $B/attnforge-tma2 verify --backend cuda --suite quick --seed 194 > $OUT/verify-quick-tma2.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick-tma2.log)"
grep -E "^FAIL" $OUT/verify-quick-tma2.log | head -5
if ! grep -q " 0 failed" $OUT/verify-quick-tma2.log; then tail -20 $OUT/verify-quick-tma2.log; exit 1; fi
t0=$(date +%s)
timeout 90 python3 bench/ab.py --bin main=$B/attnforge-main --bin tma2=$B/attnforge-tma2 \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal --shape decode-f16-d128-h32/8-b64-kv4096-p16 \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-tma2.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-tma2.txt; echo "ab tma2 ($(( $(date +%s) - t0 )) s)"
left=$(( 555 - ($(date +%s) - T0) ))
t0=$(date +%s)
timeout $left bash scripts/gpu-suite --suite full --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|f16qk|ragged|s8192" $OUT/suite/section-prefill.md | head -30
echo "total $(( $(date +%s) - T0 )) s"
