#!/usr/bin/env bash
# H200: flash prefill attention on the matrix cores against the tiled kernel it replaces
# (HIPDECODE_GPU_ATTN_PREFILL=tiled is the old path, in the same binary) and llama.cpp, on the
# 8B shape; and the GPU tests of this change, with the golden GPU entries re-blessed (issue 23).
# Writes under /tmp/fa; start it with setsid, then `bash ... collect` packs $OUT/fa.tgz.
#   1. llama.cpp is built from .dev/peer and the 8B shape synthesized while the tests run;
#   2. bench-decode -p 512 and -p 4096 -n 0 -r 3, tiled then auto (flash), two rounds;
#   3. llama-bench -p 512,4096 -n 0 -fa 1 -ngl 99 -r 3, twice, between our rounds;
#   4. decode at depth: bench-decode -p 0 -n 64 -d 4096 and -d 16384 -r 3, then llama-bench
#      -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3; per-op profiles of the 4096-token prefill.
set -o pipefail
D=/tmp/fa
if [ "${1:-}" = collect ]; then
  cp $D/greedy_tokens.json "$OUT/" 2>/dev/null
  tar czf "$OUT/fa.tgz" -C /tmp fa 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
L=/tmp/llama3-8b-q4_k_m.gguf
B=bundle/bin
LB=/tmp/llama/b/bin
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" > $D/status
[ -d /tmp/llama ] || (bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1 &)
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1
echo "model written at $(date -u +%T)" >> $D/status
HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json timeout 300 bundle/tests/golden_tokens-* gpu_greedy \
  > $D/golden-bless.log 2>&1
echo "golden bless exit $? at $(date -u +%T)" >> $D/status
for t in gpu_attention step_batch generate_many backend_conformance gpu_backend offload_run; do
  timeout 300 bundle/tests/$t-* --test-threads=2 > $D/test-$t.log 2>&1
  echo "$t tests exit $? at $(date -u +%T)" >> $D/status
done
pp() { for p in 512 4096; do
  HIPDECODE_GPU_ATTN_PREFILL=$2 timeout 200 $B/bench-decode -m $L -p $p -n 0 -r 3 --device gpu \
    > $D/pp$p-$1.md 2>&1; done
  echo "pp $1 exit $? at $(date -u +%T)" >> $D/status; }
lpp() { timeout 300 $LB/llama-bench -m $L -p 512,4096 -n 0 -fa 1 -ngl 99 -r 3 > $D/pp-$1.md 2>&1
  echo "llama-bench $1 exit $? at $(date -u +%T)" >> $D/status; }
pp tiled-1 tiled
pp flash-1 auto
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $D/status
lpp llama-1
pp flash-2 auto
pp tiled-2 tiled
lpp llama-2
for d in 4096 16384; do
  timeout 300 $B/bench-decode -m $L -p 0 -n 64 -d $d -r 3 --device gpu > $D/tg64-d$d.md 2>&1
  echo "tg64 at depth $d exit $? at $(date -u +%T)" >> $D/status
done
timeout 300 $LB/llama-bench -m $L -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3 > $D/tg-llama.md 2>&1
echo "llama-bench depth exit $? at $(date -u +%T)" >> $D/status
timeout 120 $B/hipdecode profile -m $L -p 4096 --prefill > $D/profile-pp4096-flash.txt 2>&1
HIPDECODE_GPU_ATTN_PREFILL=tiled timeout 120 $B/hipdecode profile -m $L -p 4096 --prefill \
  > $D/profile-pp4096-tiled.txt 2>&1
echo "done $(date -u +%T)" >> $D/status
