#!/usr/bin/env bash
# Session 14, device call 3: f16 QK on wgmma with the V offset of a 32-key piece fixed for the
# column layout (run 2 read the wrong V rows at head dims 128/256); two-warpgroup twin at head dim
# 64 too. Full verify (seed 121), quick at seed 1, the f16-max cases at seeds 2-9; ABBA against
# c3e0533 + AF_W8 (f16 QK on mma.sync, D=64 one warpgroup); the D=64 grid beside FlashInfer FA2.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 121 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-full.log; grep -E "^FAIL" $OUT/verify-full.log | head -8 | cut -c1-400
$B/attnforge verify --backend cuda --suite quick --seed 1 > $OUT/verify-quick.log 2>&1; qrc=$?; echo "verify quick seed 1 exit $qrc"; tail -1 $OUT/verify-quick.log; grep -E "^FAIL" $OUT/verify-quick.log | head -5 | cut -c1-400
for s in 2 3 4 5 6 7 8 9; do $B/attnforge verify --backend cuda --suite full --seed $s --filter f16-max 2>&1 | tail -1 | sed "s/^/seed $s: /"; done
[ $vrc -eq 0 ] && [ $qrc -eq 0 ] || exit 1
t0=$(date +%s)
timeout 240 python3 bench/ab.py --bin main=$B/attnforge-w8 --bin f16g=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape f16-d128-h32/32-s4096-causal-softcap50 \
 --shape f16-d256-h32/32-s4096-causal-f16qk --shape f16-d256-h32/32-s4096-causal --shape f16-d256-h32/32-s4096-noncausal-f16qk --shape f16-d256-h32/32-s4096-noncausal \
 --shape f16-d64-h32/32-s4096-causal --shape bf16-d64-h32/8-s16384-noncausal \
 --rounds 1 --out $OUT/ab-f16g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-f16g.txt; echo "ab f16g ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 250 bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2 --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "x \|$" $OUT/suite.log | awk -F'|' '{print $2, $5}' | sort -k2 -n | head -6; grep geometric $OUT/suite.log
ls $OUT/suite
