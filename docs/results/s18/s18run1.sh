#!/usr/bin/env bash
# Session 18, device call 1, main (de6423c): the verification left open by session 17
# (compute-sanitizer memcheck and racecheck after the TMA copies and the custom-mask words),
# ncu pipe and stall figures of four headline kernels, then the D=64 grid beside FA2 and cuDNN.
set -uo pipefail
export PYTHONUNBUFFERED=1
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge-main
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 90 $B verify --backend cuda --suite quick --seed 201 > $OUT/verify-quick.log 2>&1; echo "verify quick exit $? ($(( $(date +%s) - T0 )) s): $(tail -1 $OUT/verify-quick.log)"
t0=$(date +%s)
timeout 150 $SAN --tool memcheck --leak-check no --print-limit 20 $B verify --backend cuda --suite quick --seed 201 > $OUT/memcheck-quick.log 2>&1; echo "memcheck quick exit $? ($(( $(date +%s) - t0 )) s): $(grep -E 'ERROR SUMMARY|passed,' $OUT/memcheck-quick.log | tr '\n' ' ')"
t0=$(date +%s)
timeout 80 $SAN --tool racecheck --print-limit 20 $B verify --backend cuda --suite quick --seed 201 --filter d128 > $OUT/racecheck-d128.log 2>&1; echo "racecheck d128 exit $? ($(( $(date +%s) - t0 )) s): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed,' $OUT/racecheck-d128.log | tr '\n' ' ')"
t0=$(date +%s)
timeout 60 $SAN --tool synccheck --print-limit 20 $B verify --backend cuda --suite quick --seed 201 --filter d128 > $OUT/synccheck-d128.log 2>&1; echo "synccheck d128 exit $? ($(( $(date +%s) - t0 )) s): $(grep -E 'ERROR SUMMARY|passed,' $OUT/synccheck-d128.log | tr '\n' ' ')"
for s in f16-d128-h32/32-s4096-causal f16-d128-h32/32-s4096-causal-softcap50 f16-d128-h32/32-s4096-causal-f16qk f16-d128-h32/32-s4096-noncausal; do
  t0=$(date +%s); tag=$(echo $s | tr '/' '_')
  timeout 60 $NCU --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --print-details all \
    -k regex:attnforge_prefill -s 3 -c 1 $B bench --suite prefill --filter "$s" --runs 5 --warmup 2 > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $s exit $? ($(( $(date +%s) - t0 )) s)"
  grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|Shared Memory|Tensor|XU|FMA|Stall" $OUT/ncu-$tag.txt | head -30
done
left=$(( 560 - ($(date +%s) - T0) ))
echo "grid budget $left s"
t0=$(date +%s)
timeout $left bash scripts/gpu-suite --suite quick --bench prefill --filter -d64- --impls flashinfer-fa2,torch-cudnn --out $OUT/suite > $OUT/suite.log 2>&1
echo "suite exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed, .* failed" $OUT/suite.log | tail -1; grep geometric $OUT/suite.log
echo "total $(( $(date +%s) - T0 )) s"
