#!/usr/bin/env bash
# H200: products of 9 to 256 token rows on the matrix-core kernel (matmul_mma) against the
# vendor GEMM they took before, in one binary (HIPDECODE_GPU_MMA_ROWS=0 is the old path), and
# llama.cpp in the same run (issues 21 and 23). Writes under /tmp/mma; start it with setsid,
# then `bash ... collect` packs $OUT/mma.tgz.
#   1. the GPU tests of the kernel, while llama.cpp is built from .dev/peer and the 8B shape
#      is synthesized;
#   2. batched decode -npp 128 -ntg 128 -npl $NPL: vendor (rows=0), mma (default) and
#      llama-batched-bench (-c 65536 -b 2048 -ub 512 -fa on -ngl 99), two rounds alternating,
#      nvidia-smi sampling memory.used every 100 ms;
#   3. profiles of 8 decode steps of 32 sequences, both arms;
#   4. batch-1 prefill of 64, 128, 256 and 512 tokens, rows cap 0 and 512, alternating, two
#      rounds (where the matrix-core kernel stops paying against the vendor GEMM).
set -o pipefail
D=/tmp/mma
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/mma.tgz" -C /tmp mma 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
L=/tmp/llama3-8b-q4_k_m.gguf
B=bundle/bin
LB=/tmp/llama/b/bin
NPL=${NPL:-1,8,9,16,32,64,128,256}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" > $D/status
[ -d /tmp/llama ] || (bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1 &)
for t in bundle/tests/gpu_quant-*; do
  timeout 300 $t --test-threads=1 mma > $D/test-mma.log 2>&1
  echo "mma tests exit $? at $(date -u +%T)" >> $D/status
done
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1
echo "model written at $(date -u +%T)" >> $D/status

LOGS=$D
source scripts/h200/sampled.sh
ours() { HIPDECODE_GPU_MMA_ROWS=$2 sampled $1 timeout 400 $B/bench-decode -m $L --device gpu \
  --npl $NPL --npp 128 --ntg 128; }
ours vendor-1 0
ours mma-1 256
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $D/status
llama() { sampled $1 timeout 400 $LB/llama-batched-bench -m $L -c 65536 -b 2048 -ub 512 \
  -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on; }
llama llama-1
ours mma-2 256
ours vendor-2 0
llama llama-2
for rows in 0 256; do
  HIPDECODE_GPU_MMA_ROWS=$rows timeout 120 $B/hipdecode profile -m $L -b 32 -p 128 -n 8 \
    > $D/profile-rows$rows-b32.txt 2>&1
done
echo "profiles at $(date -u +%T)" >> $D/status
for r in 1 2; do
  for rows in 0 512; do
    for p in 64 128 256 512; do
      HIPDECODE_GPU_MMA_ROWS=$rows timeout 120 $B/bench-decode -m $L -p $p -n 16 -r 3 \
        --device gpu > $D/pp$p-rows$rows-$r.md 2>&1
    done
    echo "prefill rows cap $rows round $r exit $? at $(date -u +%T)" >> $D/status
  done
done
echo "done $(date -u +%T)" >> $D/status
