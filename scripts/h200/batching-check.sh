#!/usr/bin/env bash
# H200: the checks of many sequences at once (issue 21). Runs in the background (setsid) and
# writes under /tmp/check, so a later call collects it:
#   1. llama.cpp is built from .dev/peer (build-on-device.sh) while the two synthetic shapes
#      are written;
#   2. verify-rocm with the GPU required (every GPU test: the paged kernels, the batched
#      steps against each sequence alone on the GPU);
#   3. batched decode, -npp 128 -ntg 128 -npl 1,8,32,64, on the 8B and 30B-A3B shapes:
#      bench-decode's batched mode and llama-batched-bench (-c 20480 -b 2048 -ub 512 -fa on
#      -ngl 99), one model per process, alternating, with nvidia-smi sampling the device's
#      used memory every 100 ms (the process's peak as a user sees it, context included);
#   4. batch-1 tg128 of this bundle's bench-decode and the parent's ($PARENT), alternating.
# `bash ... collect` packs the logs into $OUT/check.tgz.
set -o pipefail
C=/tmp/check
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/check.tgz" -C /tmp check 2>/dev/null
  cat $C/status 2>/dev/null; tail -4 $C/verify.log 2>/dev/null
  exit 0
fi
mkdir -p $C
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
PARENT=${PARENT:-/tmp/parent}
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
LB=/tmp/llama/b/bin
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $C/gpu.txt 2>&1
echo "started $(date -u +%T)" > $C/status
[ -d /tmp/llama ] || bash .dev/peer/build-on-device.sh > $C/llama-build.log 2>&1
# The shapes may be being written by an earlier call (logs /tmp/synth-{l,q}.log).
[ -f /tmp/synth-l.log ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /tmp/synth-l.log 2>&1 &
[ -f /tmp/synth-q.log ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /tmp/synth-q.log 2>&1 &
HIPDECODE_REQUIRE_GPU=1 bundle/run.sh > $C/verify.log 2>&1
echo "verify-rocm exit $? at $(date -u +%T)" >> $C/status
wait
for i in $(seq 1 60); do grep -q wrote /tmp/synth-l.log && grep -q wrote /tmp/synth-q.log && break; sleep 5; done
echo "models written at $(date -u +%T)" >> $C/status
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $C/status

LOGS=$C
source scripts/h200/sampled.sh
for m in l8b:$L q30:$Q; do
  n=${m%%:*}; f=${m#*:}
  for r in 1 2; do
    sampled ours-$n-$r timeout 300 bundle/bin/bench-decode -m $f --device gpu \
      --npl 1,8,32,64 --npp 128 --ntg 128
    sampled llama-$n-$r timeout 300 $LB/llama-batched-bench -m $f -c 20480 -b 2048 -ub 512 \
      -npp 128 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on
  done
done
for r in 1 2; do
  for arm in parent new; do
    [ $arm = parent ] && B=$PARENT || B=bundle/bin
    timeout 200 $B/bench-decode -m $L -m $Q -p 512 -n 128 -r 3 --device gpu \
      > $C/b1-$arm-$r.md 2>&1
    echo "batch-1 $arm round $r exit $? at $(date -u +%T)" >> $C/status
  done
done
echo "done $(date -u +%T)" >> $C/status
