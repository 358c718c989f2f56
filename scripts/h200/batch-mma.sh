#!/usr/bin/env bash
# H200: the matrix-core kernels (issues 21 and 23). Products of 9 to 256 token rows on
# matmul_mma against the vendor GEMM they took before, and flash prefill attention against the
# tiled kernel, each in one binary (HIPDECODE_GPU_MMA_ROWS=0 and HIPDECODE_GPU_ATTN_PREFILL=tiled
# are the old paths), with llama.cpp in the same run. Writes under /tmp/mma; start it with
# setsid, then `bash ... collect` packs $OUT/mma.tgz.
#   1. the new kernels' GPU tests, the golden GPU entries re-blessed, then the decode test
#      binaries that run batched steps and prefill on the GPU, while llama.cpp is built from
#      .dev/peer and the 8B shape is synthesized;
#   2. batched decode -npp 128 -ntg 128 -npl $NPL: vendor (rows=0), mma (default) and
#      llama-batched-bench (-c 65536 -b 2048 -ub 512 -fa on -ngl 99), two rounds alternating,
#      nvidia-smi sampling memory.used every 100 ms;
#   3. profiles of 8 decode steps of 32 sequences, both arms;
#   4. pp512 and pp4096 (-n 0): tiled attention + vendor GEMM (the old paths), flash + default,
#      and llama-bench -p 512,4096 -n 0 -fa 1 -ngl 99 -r 3, two rounds alternating;
#   5. batch-1 prefill of 128, 256 and 512 tokens with the rows cap at 0 and 512 (where the
#      matrix-core products stop paying against the vendor GEMM).
# Env: NPL (batch sizes), PP=0 skips steps 4 and 5, BLESS=0 checks the golden GPU entries
# instead of re-blessing them, MMA_ROWS (256) the cap of the matrix-core arm.
set -o pipefail
D=/tmp/mma
PP=${PP:-1}
BLESS=${BLESS:-1}
MMA_ROWS=${MMA_ROWS:-256}
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
NPL=${NPL:-1,8,16,32,64,128,256}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" > $D/status
[ -d /tmp/llama ] || (bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1 &)
[ -f $L ] || (bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1; \
  echo "model written at $(date -u +%T)" >> $D/status) &
synth=$!
timeout 300 bundle/tests/gpu_quant-* --test-threads=1 mma > $D/test-mma.log 2>&1
echo "matmul_mma tests exit $? at $(date -u +%T)" >> $D/status
timeout 300 bundle/tests/gpu_attention-* --test-threads=1 > $D/test-attention.log 2>&1
echo "attention tests exit $? at $(date -u +%T)" >> $D/status
if [ "$BLESS" = 1 ]; then
  HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json timeout 300 bundle/tests/golden_tokens-* \
    gpu_greedy > $D/golden-bless.log 2>&1
  echo "golden bless exit $? at $(date -u +%T)" >> $D/status
else
  timeout 300 bundle/tests/golden_tokens-* > $D/golden.log 2>&1
  echo "golden tests exit $? at $(date -u +%T)" >> $D/status
fi
for t in step_batch generate_many backend_conformance gpu_backend offload_run; do
  timeout 300 bundle/tests/$t-* --test-threads=2 > $D/test-$t.log 2>&1
  echo "$t tests exit $? at $(date -u +%T)" >> $D/status
done
# The batched tests again with the matrix-core products on (off by default so far).
for t in step_batch generate_many; do
  HIPDECODE_GPU_MMA_ROWS=$MMA_ROWS timeout 300 bundle/tests/$t-* --test-threads=2 \
    > $D/test-$t-mma.log 2>&1
  echo "$t tests with rows cap $MMA_ROWS exit $? at $(date -u +%T)" >> $D/status
done
wait $synth

LOGS=$D
source scripts/h200/sampled.sh
ours() { HIPDECODE_GPU_MMA_ROWS=$2 sampled $1 timeout 400 $B/bench-decode -m $L --device gpu \
  --npl $NPL --npp 128 --ntg 128; }
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $D/status
llama() { sampled $1 timeout 400 $LB/llama-batched-bench -m $L -c 65536 -b 2048 -ub 512 \
  -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on; }
ours vendor-1 0
ours mma-1 $MMA_ROWS
llama llama-1
ours mma-2 $MMA_ROWS
ours vendor-2 0
llama llama-2
for rows in 0 $MMA_ROWS; do
  for b in 16 32; do
    HIPDECODE_GPU_MMA_ROWS=$rows timeout 120 $B/hipdecode profile -m $L -b $b -p 128 -n 8 \
      > $D/profile-rows$rows-b$b.txt 2>&1
  done
done
echo "profiles at $(date -u +%T)" >> $D/status
[ "$PP" = 1 ] || { echo "done $(date -u +%T)" >> $D/status; exit 0; }
pp() { for p in 512 4096; do
  HIPDECODE_GPU_ATTN_PREFILL=$2 HIPDECODE_GPU_MMA_ROWS=$3 timeout 200 $B/bench-decode -m $L \
    -p $p -n 0 -r 3 --device gpu > $D/pp$p-$1.md 2>&1; done
  echo "pp $1 exit $? at $(date -u +%T)" >> $D/status; }
lpp() { timeout 300 $LB/llama-bench -m $L -p 512,4096 -n 0 -fa 1 -ngl 99 -r 3 > $D/pp-$1.md 2>&1
  echo "llama-bench $1 exit $? at $(date -u +%T)" >> $D/status; }
pp old-1 tiled 0
pp new-1 auto 256
lpp llama-1
pp new-2 auto 256
pp old-2 tiled 0
lpp llama-2
for rows in 0 512; do
  for p in 128 256 512; do
    HIPDECODE_GPU_MMA_ROWS=$rows timeout 120 $B/bench-decode -m $L -p $p -n 0 -r 3 \
      --device gpu > $D/pp$p-rows$rows.md 2>&1
  done
  echo "prefill rows cap $rows exit $? at $(date -u +%T)" >> $D/status
done
echo "done $(date -u +%T)" >> $D/status
