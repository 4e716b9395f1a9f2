#!/usr/bin/env bash
# Session 13, device call 2: branch wgmma with head dim 128 (column layout of the Q/K/V tiles,
# two m64n64k16 per k16 block for P V; 128-row twin for variants without a transform, 64-row
# twin for all). Full verify; ABBA main vs wgmma on D=128 shapes; f32 vs f16 QK and soft-cap
# with the wgmma tile forced; then the D=128 grid beside FlashInfer FA2.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
t0=$(date +%s)
$B/attnforge verify --backend cuda --suite full --seed 71 > $OUT/verify-g.log 2>&1; vrc=$?
echo "verify g exit $vrc ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/verify-g.log
grep -E "^FAIL" $OUT/verify-g.log | head -20
t0=$(date +%s)
python3 bench/ab.py --bin main=$B/attnforge-main --bin g=$B/attnforge \
 --shape f16-d128-h32/32-s4096-causal --shape f16-d128-h32/32-s4096-noncausal --shape f16-d128-h32/32-s1024-noncausal \
 --shape f16-d128-h32/32-s512-causal --shape bf16-d128-h32/8-s8192-causal --shape f16-d128-h32/32-s16384-noncausal \
 --shape f16-d128-h32/32-ragged16-causal --shape paged-prefill-f16-d128-h32/8-b16-q1024-kv5120-p16-causal \
 --shape f16-d128-h32/32-s4096-causal-softcap50 --shape f16-d128-h32/32-s4096-causal-f16qk \
 --rounds 1 --out $OUT/ab-g.jsonl 2>&1 | grep -v "^+" | tee $OUT/ab-g.txt; echo "ab g ($(( $(date +%s) - t0 )) s)"
for t in w4q2kv64g w4q2kv64; do
  $B/attnforge bench --tile $t --filter f16-d128-h32/32-s4096-causal-softcap50 --json-out /tmp/softcap-$t.jsonl > /tmp/softcap-$t.txt 2>&1
  echo "softcap tile $t exit $?"; tail -4 /tmp/softcap-$t.txt; cat /tmp/softcap-$t.jsonl >> $OUT/softcap.jsonl
done
if [ $vrc -eq 0 ]; then
  t0=$(date +%s)
  bash scripts/gpu-suite --suite quick --bench prefill --filter -d128- --impls flashinfer-fa2 --out $OUT/suite > $OUT/suite.log 2>&1
  echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "^\| .*d128|geometric" $OUT/suite.log | head -70
fi
