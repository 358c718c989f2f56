#!/usr/bin/env bash
# H200: decode steps of 9..31 sequences on the vendor GEMM (this bundle) against the parent's
# tiled f32 kernels there (issue 21). Writes under /tmp/dsp; start it with setsid, then
# `bash ... collect` packs $OUT/dsp.tgz.
#   1. llama.cpp is built from .dev/peer while the 8B shape is synthesized and the first
#      round of ours runs;
#   2. batched decode -npp 128 -ntg 128 -npl 1,8,12,16,24,32,64: new, parent (.dev/parent)
#      and llama-batched-bench (-c 20480 -b 2048 -ub 512 -fa on -ngl 99), two rounds,
#      nvidia-smi sampling memory.used every 100 ms;
#   3. profiles of 8 decode steps of 16 sequences, new and parent;
#   4. batch-1 tg128 / pp512, new and parent, alternating, two rounds.
set -o pipefail
D=/tmp/dsp
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/dsp.tgz" -C /tmp dsp 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
L=/tmp/llama3-8b-q4_k_m.gguf
NEW=bundle/bin
OLD=.dev/parent
LB=/tmp/llama/b/bin
NPL=1,8,12,16,24,32,64
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" > $D/status
[ -d /tmp/llama ] || bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1
echo "model written at $(date -u +%T)" >> $D/status

LOGS=$D
source scripts/h200/sampled.sh
ours() { sampled $1 timeout 300 $2/bench-decode -m $L --device gpu --npl $NPL --npp 128 --ntg 128; }
ours new-1 $NEW
ours old-1 $OLD
for b in 16; do
  timeout 120 $NEW/hipdecode profile -m $L -b $b -p 128 -n 8 > $D/profile-new-b$b.txt 2>&1
  timeout 120 $OLD/hipdecode profile -m $L -b $b -p 128 -n 8 > $D/profile-old-b$b.txt 2>&1
  echo "profiles B=$b at $(date -u +%T)" >> $D/status
done
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $D/status
llama() { sampled $1 timeout 300 $LB/llama-batched-bench -m $L -c 20480 -b 2048 -ub 512 \
  -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on; }
llama llama-1
ours new-2 $NEW
ours old-2 $OLD
llama llama-2
for r in 1 2; do
  for arm in old new; do
    [ $arm = old ] && B=$OLD || B=$NEW
    timeout 200 $B/bench-decode -m $L -p 512 -n 128 -r 3 --device gpu > $D/b1-$arm-$r.md 2>&1
    echo "batch-1 $arm round $r exit $? at $(date -u +%T)" >> $D/status
  done
done
echo "done $(date -u +%T)" >> $D/status
