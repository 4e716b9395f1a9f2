#!/usr/bin/env bash
# Session 26, device call 2: the widen-first experiment (attnforge-wf: every f16-QK wgmma kernel
# whose paths met before one P V, F16_WARP_CHOICE, widens its accumulators first and runs the
# f32-QK step, so that its exponents interleave with the P V products as the f32 kernels' do)
# against the planner change alone (attnforge). The f16-QK cases of the full verify on wf, then
# every f16-QK shape of the prefill list in A B B A, two rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
T0=$(date +%s)
timeout 150 .device/bin/attnforge-wf verify --backend cuda --suite full --filter qk16 > $OUT/verify-qk16-wf.log 2>&1
echo "verify wf exit $? ($(( $(date +%s) - T0 )) s)"; tail -2 $OUT/verify-qk16-wf.log
S=()
for s in f16-d128-h32/32-s4096-causal-f16qk f16-d128-h32/32-s4096-noncausal-f16qk f16-d128-h32/32-s8192-causal-f16qk \
  f16-d128-h32/8-s8192-causal-f16qk f16-d128-h32/32-s4096-causal-softcap50-f16qk f16-d256-h32/32-s4096-causal-f16qk \
  f16-d256-h32/32-s4096-noncausal-f16qk f16-d64-h32/32-s4096-causal-f16qk f16-d256-h32/32-s4096-causal; do S+=(--shape "$s"); done
timeout 300 python3 bench/ab.py --bin base=.device/bin/attnforge --bin wf=.device/bin/attnforge-wf "${S[@]}" \
  --rounds 2 --out $OUT/ab-wf.jsonl 2>&1 | tee $OUT/ab-wf.txt
echo "total $(( $(date +%s) - T0 )) s"
