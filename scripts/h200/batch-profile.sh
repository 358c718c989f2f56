#!/usr/bin/env bash
# H200: where a decode step of B sequences spends its time (issue 21's speed at B >= 8).
# Writes under /tmp/prof; run it with setsid, then `bash ... collect` packs $OUT/prof.tgz.
#   1. the 8B shape is synthesized (skipped when an earlier call wrote it);
#   2. `hipdecode profile -b B` for B = 1, 8, 16, 32, 64: per-op times of 8 decode steps
#      after 128-token prompts;
#   3. bench-decode's batched mode at -npp 128 -ntg 128 for the same B, for the step times
#      with graphs.
set -o pipefail
P=/tmp/prof
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/prof.tgz" -C /tmp prof 2>/dev/null
  cat $P/status 2>/dev/null
  exit 0
fi
mkdir -p $P
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
L=/tmp/llama3-8b-q4_k_m.gguf
BIN=${BIN:-bundle/bin}
echo "started $(date -u +%T)" > $P/status
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $P/synth.log 2>&1
echo "model written at $(date -u +%T)" >> $P/status
for b in 1 8 16 32 64; do
  timeout 120 $BIN/hipdecode profile -m $L -b $b -p 128 -n 8 > $P/profile-b$b.txt 2>&1
  echo "profile B=$b exit $? at $(date -u +%T)" >> $P/status
done
timeout 300 $BIN/bench-decode -m $L --device gpu --npl 1,8,16,32,64 --npp 128 --ntg 128 \
  > $P/batched.md 2>&1
echo "batched exit $? at $(date -u +%T)" >> $P/status
echo "done $(date -u +%T)" >> $P/status
