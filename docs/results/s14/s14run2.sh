#!/usr/bin/env bash
# Session 14, device call 2: f16 QK on wgmma (every twin, f16 accumulators, warpgroup overflow vote,
# per-n8 f32 recompute through the column-layout ldmatrix offsets). Full verify (seed 111), the
# quick suite at seed 1 (session 13's failing case) and the f16-max cases at more seeds; ABBA
# against c3e0533 (+AF_W8: f16 QK on mma.sync) on f16-QK and f32 shapes; forced two-warpgroup
# tiles at head dims 64 and 256 against the planner's.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 111 > $OUT/verify-full.log 2>&1; vrc=$?
echo "verify full exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-full.log; grep -E "^FAIL" $OUT/verify-full.log | head -20
$B/attnforge verify --backend cuda --suite quick --seed 1 > $OUT/verify-quick.log 2>&1; echo "verify quick seed 1 exit $?"; tail -1 $OUT/verify-quick.log; grep -E "^FAIL" $OUT/verify-quick.log | head
for s in 2 3 4 5 6 7 8 9; do $B/attnforge verify --backend cuda --suite full --seed $s --filter f16-max 2>&1 | tail -1 | sed "s/^/seed $s: /"; done
t0=$(date +%s)
timeout 300 python3 bench/ab.py --bin main=$B/attnforge-w8 --bin f16g=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d128-h32/8-s8192-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50-f16qk --shape f16-d128-h32/32-s4096-causal-softcap50 \
 --shape f16-d256-h32/32-s4096-causal-f16qk --shape f16-d256-h32/32-s4096-causal --shape f16-d256-h32/32-s4096-noncausal-f16qk --shape f16-d256-h32/32-s4096-noncausal \
 --shape f16-d64-h32/32-s4096-causal --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --rounds 1 --out $OUT/ab-f16g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-f16g.txt; echo "ab f16g ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin plan=$B/attnforge --bin w8=$B/tile-w8q1kv64g \
 --shape f16-d64-h32/32-s4096-causal --shape f16-d64-h32/32-s4096-noncausal --shape bf16-d64-h32/8-s16384-noncausal --shape f16-d64-h32/32-s1024-noncausal \
 --rounds 1 --out $OUT/ab-d64w8.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-d64w8.txt; echo "ab d64 w8 ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
timeout 150 python3 bench/ab.py --bin plan=$B/attnforge --bin w8=$B/tile-w8q1kv64b1g \
 --shape f16-d256-h32/32-s4096-causal --shape f16-d256-h32/32-s2048-noncausal --shape bf16-d256-h32/8-s16384-noncausal \
 --rounds 1 --out $OUT/ab-d256w8.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-d256w8.txt; echo "ab d256 w8 ($(( $(date +%s) - t0 )) s)"
