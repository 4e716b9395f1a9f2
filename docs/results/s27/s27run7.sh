#!/usr/bin/env bash
# Session 27, device call 7: the final binary (bench's event helper refactor) times one prefill
# and one paged shape (each checked against the reference first), as a smoke run of the timing.
set -uo pipefail
export ATTNFORGE_CACHE_DIR=/tmp/afcache
B=.device/bin/attnforge
timeout 120 $B bench --filter f16-d128-h32/32-s4096-causal --json-out $OUT/prefill.jsonl 2>&1 | tail -4
timeout 120 $B bench --suite paged --json-out $OUT/paged.jsonl 2>&1 | tail -6
