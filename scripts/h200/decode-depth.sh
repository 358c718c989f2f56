#!/usr/bin/env bash
# H200: decode attention at depth (issue 23, part a). The key-tile decode kernel against the
# one-warp-per-key kernel it replaces for f16 caches (HIPDECODE_GPU_ATTN_DECODE=warp-per-key
# is the old path, in the same binary) and llama.cpp, on the 8B, Gemma 3 270M and 30B-A3B
# shapes. Writes under /tmp/dd; start it with setsid, then `bash ... collect` packs $OUT/dd.tgz.
#   1. llama.cpp is built from .dev/peer and the shapes synthesized while the tests run
#      (gpu_attention, backend_conformance, the golden GPU tokens compared, not blessed);
#   2. --ab of the two kernels, 4 rounds, -p 0 -n 64 -d 4096,16384, 8B and Gemma;
#   3. the rows, alternating with llama-bench (-fa 1 -ngl 99 -r 3), two rounds:
#      bench-decode -p 0 -n 64 -d 4096,16384 -r 5;
#   4. per-op profiles of decode at 4k, 16k and 32k of context (both kernels at 16k);
#   5. memory at d32000 as nvidia-smi sees it (100 ms samples, the peak): bench-decode against
#      llama-bench -ctk/-ctv f16 and q8_0;
#   6. the 30B-A3B shape: pp4096 and tg64 @ d16384 against llama-bench.
set -o pipefail
D=/tmp/dd
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/dd.tgz" -C /tmp dd 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
L=/tmp/llama3-8b-q4_k_m.gguf
G=/tmp/gemma3-270m-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
B=bundle/bin
LB=/tmp/llama/b/bin
WARP=HIPDECODE_GPU_ATTN_DECODE=warp-per-key
st() { echo "$* at $(date -u +%T)" >> $D/status; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" > $D/status
[ -d /tmp/llama ] || (bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1 &)
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1
[ -f $G ] || bundle/xtask synth-model gemma3-270m-q4_k_m -o $G >> $D/synth.log 2>&1
st "8B and Gemma shapes written"
[ "${Q30:-1}" = 0 ] || ([ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > $D/synth-30b.log 2>&1; st "30B shape written rc $?") &

for t in gpu_attention gpu_long_context backend_conformance; do
  timeout 300 bundle/tests/$t-* --test-threads=2 > $D/test-$t.log 2>&1
  st "$t tests exit $?"
done
timeout 300 bundle/tests/golden_tokens-* gpu_greedy > $D/golden.log 2>&1
rc=$?; st "golden gpu_greedy exit $rc"
if [ $rc -ne 0 ]; then
  HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json timeout 300 bundle/tests/golden_tokens-* gpu_greedy \
    > $D/golden-bless.log 2>&1
  st "golden bless exit $?"
fi

for m in $L $G; do
  n=$(basename $m .gguf)
  timeout 400 $B/bench-decode -m $m -p 0 -n 64 -d 4096,16384 --device gpu --ab "$WARP" '' \
    --rounds ${ROUNDS:-4} > $D/ab-$n.md 2>&1
  st "ab $n exit $?"
done

for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
ours() { timeout 300 $B/bench-decode -m $1 -p 0 -n 64 -d 4096,16384 -r 5 --device gpu \
  > $D/tg-$(basename $1 .gguf)-$2.md 2>&1; st "ours $(basename $1) $2 exit $?"; }
peer() { timeout 300 $LB/llama-bench -m $1 -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3 \
  > $D/tg-$(basename $1 .gguf)-llama-$2.md 2>&1; st "llama $(basename $1) $2 exit $?"; }
# PEER=0 skips llama.cpp (a second pass of this script in the same session, whose first pass
# measured it).
for m in $L $G; do
  ours $m 1
  [ "${PEER:-1}" = 0 ] || { peer $m 1; [ "${ONE:-0}" = 1 ] || { peer $m 2; ours $m 2; }; }
done

for p in 4096 16384 32000; do
  timeout 200 $B/hipdecode profile -m $L -p $p -n 16 > $D/profile-d$p.txt 2>&1
  st "profile d$p exit $?"
done
env $WARP timeout 200 $B/hipdecode profile -m $L -p 16384 -n 16 > $D/profile-d16384-warp.txt 2>&1
st "profile d16384 warp exit $?"

peak() {  # peak <name> <command...>: the largest memory.used sample while the command runs
  local f=$D/smi-$1.csv
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $f 2>&1 &
  local pid=$!
  sleep 1
  shift
  "$@" > $D/mem-$(basename $f .csv).out 2>&1
  local rc=$?
  sleep 1
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
  echo "$(basename $f .csv) rc $rc peak $(sort -n $f | tail -1) MiB idle $(head -1 $f) MiB" >> $D/memory.txt
}
peak ours-f16 timeout 300 $B/bench-decode -m $L -p 0 -n 64 -d 32000 -r 1 --device gpu
[ "${PEER:-1}" = 0 ] || peak llama-f16 timeout 300 $LB/llama-bench -m $L -p 0 -n 64 -d 32000 -fa 1 -ngl 99 -r 1 -ctk f16 -ctv f16
[ "${PEER:-1}" = 0 ] || peak llama-q8_0 timeout 300 $LB/llama-bench -m $L -p 0 -n 64 -d 32000 -fa 1 -ngl 99 -r 1 -ctk q8_0 -ctv q8_0
st "memory at d32000 done"

[ "${Q30:-1}" = 0 ] && { echo "done $(date -u +%T)" >> $D/status; exit 0; }
for i in $(seq 1 60); do [ -f $Q ] && grep -q "30B shape written" $D/status && break; sleep 5; done
timeout 300 $B/bench-decode -m $Q -p 4096 -n 0 -r 3 --device gpu > $D/30b-pp4096.md 2>&1
st "30b pp4096 exit $?"
timeout 300 $B/bench-decode -m $Q -p 0 -n 64 -d 16384 -r 3 --device gpu > $D/30b-tg-d16384.md 2>&1
st "30b tg d16384 exit $?"
[ "${PEER:-1}" = 0 ] || timeout 400 $LB/llama-bench -m $Q -p 4096 -n 0 -fa 1 -ngl 99 -r 3 > $D/30b-llama-pp4096.md 2>&1
[ "${PEER:-1}" = 0 ] || timeout 400 $LB/llama-bench -m $Q -p 0 -n 64 -d 16384 -fa 1 -ngl 99 -r 3 > $D/30b-llama-tg.md 2>&1
st "30b llama exit $?"
echo "done $(date -u +%T)" >> $D/status
