#!/usr/bin/env bash
# Session 16, device call 4. final = new (run 1: ragged copies, factored soft-cap, sm_90a matrix)
# plus the wgmma row sums by mma.sync where runs 2-3 measured a gain (f32 QK, head dim 128, no
# transform, unmasked or paged). ABBA main vs final on headline shapes; then gpu-suite with the
# full verify and the head-dim-128 list beside FlashInfer FA2 and torch SDPA cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
T0=$(date +%s)
t0=$(date +%s)
timeout 100 python3 bench/ab.py --bin main=$B/attnforge-main --bin final=$B/attnforge-final \
 --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s4096-causal \
 --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --shape f16-d64-h32/32-s4096-noncausal \
 --rounds 1 --out $OUT/ab-final.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-final.txt; echo "ab final ($(( $(date +%s) - t0 )) s)"
left=$(( 560 - ($(date +%s) - T0) ))
t0=$(date +%s)
timeout $left bash scripts/gpu-suite --suite full --bench prefill --filter -d128- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
grep -E "s4096-(non)?causal|softcap|f16qk|ragged|s8192" $OUT/suite/section-prefill.md | head -30
echo "total $(( $(date +%s) - T0 )) s"
