#!/usr/bin/env bash
# Session 27, device call 2: the soft-cap's tanh form (attnforge-tanh: f32-QK wgmma soft-cap
# kernels multiply Q by sm_scale / cap and take every logit as cap * tanh.approx(acc)) against
# main (attnforge-main). The full verify's soft-cap cases on tanh, then the soft-cap shapes and
# their no-variant twins in A B B A, two rounds (the cost is soft-cap against no variant).
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
T0=$(date +%s)
timeout 200 .device/bin/attnforge-tanh verify --backend cuda --suite full --seed 2027 --filter softcap > $OUT/verify-softcap-tanh.log 2>&1
echo "verify tanh exit $? ($(( $(date +%s) - T0 )) s)"; grep -iE "fail|passed" $OUT/verify-softcap-tanh.log | tail -4
S=()
for s in f16-d128-h32/32-s4096-causal-softcap50 f16-d128-h32/32-s4096-causal f16-d128-h32/32-s4096-causal-softcap2 \
  f16-d128-h32/32-s8192-causal-softcap50 f16-d128-h32/32-s8192-causal f16-d128-h32/8-s8192-causal-softcap50 \
  f16-d128-h32/8-s8192-causal f16-d128-h32/8-s4096-causal-softcap50 f16-d128-h32/8-s4096-causal \
  f16-d256-h32/32-s4096-causal-softcap50 f16-d256-h32/32-s4096-causal; do S+=(--shape "$s"); done
timeout 330 python3 bench/ab.py --bin main=.device/bin/attnforge-main --bin tanh=.device/bin/attnforge-tanh "${S[@]}" \
  --rounds 2 --out $OUT/ab-tanh.jsonl 2>&1 | tee $OUT/ab-tanh.txt
echo "total $(( $(date +%s) - T0 )) s"
