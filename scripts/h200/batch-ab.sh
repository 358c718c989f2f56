#!/usr/bin/env bash
# H200: the wide int8 products (up to 64 token rows a launch) against the parent's dispatch
# (int8 up to 8 rows, then tiled f32 or the vendor GEMM), for issue 21's decode steps of many
# sequences. Writes under /tmp/ab; start it with setsid, then `bash ... collect` packs
# $OUT/ab.tgz.
#   1. llama.cpp is built from .dev/peer while the 8B shape is synthesized;
#   2. per-op profiles of 8 decode steps of B = 8, 16, 32, 64 sequences (new), and B = 32
#      (parent);
#   3. batched decode -npp 128 -ntg 128 -npl 1,8,16,32,64: new, parent, llama-batched-bench,
#      alternating, two rounds, nvidia-smi sampling memory.used every 100 ms; and new with
#      HIPDECODE_GPU_INT8_ROWS=32 (the vendor GEMM from 33 rows) once;
#   4. batch-1 tg128 of new and parent, alternating, two rounds.
set -o pipefail
A=/tmp/ab
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/ab.tgz" -C /tmp ab 2>/dev/null
  cat $A/status 2>/dev/null
  exit 0
fi
mkdir -p $A
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
L=/tmp/llama3-8b-q4_k_m.gguf
NEW=bundle/bin
OLD=.dev/parent
LB=/tmp/llama/b/bin
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $A/gpu.txt 2>&1
echo "started $(date -u +%T)" > $A/status
[ -d /tmp/llama ] || bash .dev/peer/build-on-device.sh > $A/llama-build.log 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $A/synth.log 2>&1
echo "model written at $(date -u +%T)" >> $A/status
for b in 8 16 32 64; do
  timeout 120 $NEW/hipdecode profile -m $L -b $b -p 128 -n 8 > $A/profile-new-b$b.txt 2>&1
  echo "profile new B=$b exit $? at $(date -u +%T)" >> $A/status
done
timeout 120 $OLD/hipdecode profile -m $L -b 32 -p 128 -n 8 > $A/profile-old-b32.txt 2>&1
echo "profile old B=32 exit $? at $(date -u +%T)" >> $A/status
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $A/status

# The largest memory.used nvidia-smi reports while "$@" runs, into $A/$name.peak (MiB).
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $A/$name.smi &
  local smi=$!
  "$@" > $A/$name.md 2>&1
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  sort -n $A/$name.smi | tail -1 > $A/$name.peak
  echo "$name exit $rc peak $(cat $A/$name.peak) MiB at $(date -u +%T)" >> $A/status
}
NPL=1,8,16,32,64
for r in 1 2; do
  sampled new-$r timeout 300 $NEW/bench-decode -m $L --device gpu --npl $NPL --npp 128 --ntg 128
  sampled old-$r timeout 300 $OLD/bench-decode -m $L --device gpu --npl $NPL --npp 128 --ntg 128
  [ -x $LB/llama-batched-bench ] && sampled llama-$r timeout 300 $LB/llama-batched-bench -m $L \
    -c 20480 -b 2048 -ub 512 -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on
done
HIPDECODE_GPU_INT8_ROWS=32 sampled new-rows32 timeout 300 $NEW/bench-decode -m $L --device gpu \
  --npl 32,64 --npp 128 --ntg 128
for r in 1 2; do
  for arm in old new; do
    [ $arm = old ] && B=$OLD || B=$NEW
    timeout 200 $B/bench-decode -m $L -p 512 -n 128 -r 3 --device gpu > $A/b1-$arm-$r.md 2>&1
    echo "batch-1 $arm round $r exit $? at $(date -u +%T)" >> $A/status
  done
done
echo "done $(date -u +%T)" >> $A/status
