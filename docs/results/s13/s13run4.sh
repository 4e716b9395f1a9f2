#!/usr/bin/env bash
# Session 13, device call 4: f16-QK wgmma overflow check at the f16 maximum. Quick verify at
# seeds 1 (which failed in call 3) and 2, the f16-QK full cases at seed 3, then an ABBA.
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
for sd in 1 2; do $B/attnforge verify --backend cuda --suite quick --seed $sd > $OUT/verify-q$sd.log 2>&1; echo "quick seed $sd exit $?"; tail -1 $OUT/verify-q$sd.log; grep -E "^FAIL" $OUT/verify-q$sd.log | head -5; done
$B/attnforge verify --backend cuda --suite full --seed 3 --filter qk16 > $OUT/verify-qk16.log 2>&1; echo "qk16 full exit $?"; tail -1 $OUT/verify-qk16.log; grep -E "^FAIL" $OUT/verify-qk16.log | head -5
python3 bench/ab.py --bin main=$B/attnforge-main --bin g=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal-f16qk --shape f16-d128-h32/8-s8192-causal-f16qk --shape f16-d256-h32/32-s4096-noncausal-f16qk \
 --rounds 1 --out $OUT/ab-g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-g.txt
