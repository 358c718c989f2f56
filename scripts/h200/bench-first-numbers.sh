#!/usr/bin/env bash
# Run 2 on the H200: verify-rocm (GPU required), the GPU demo, and first bench-decode numbers.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
bundle/run.sh > $OUT/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL" $OUT/verify.log | tail -12
G=models/gemma3-270m-q4_k_m.gguf
{ $B/hipdecode run -m $G -p "Photosynthesis is the process by which" -n 64 --device gpu --temp 0
  echo "== --no-graph"
  $B/hipdecode run -m $G -p "Photosynthesis is the process by which" -n 64 --device gpu --temp 0 --no-graph
  echo "== cpu"
  $B/hipdecode run -m $G -p "Photosynthesis is the process by which" -n 64 --device cpu --temp 0
} > $OUT/demo.log 2>&1; echo "demo exit $?"
{ echo "== gemma graph"; $B/bench-decode -m $G --device gpu --pp 512 --tg 128 --runs 5 --warmup 1
  echo "== gemma no-graph"; $B/bench-decode -m $G --device gpu --pp 512 --tg 128 --runs 5 --warmup 1 --no-graph
} > $OUT/bench.log 2>&1; echo "bench gemma exit $?"
bundle/xtask synth-model llama3-8b-q4_k_m -o /tmp/l8b.gguf > /dev/null 2>&1
{ echo "== llama3-8b shape"; timeout 150 $B/bench-decode -m /tmp/l8b.gguf --device gpu --pp 512 --tg 128 --runs 3 --warmup 1; } >> $OUT/bench.log 2>&1; echo "bench 8b exit $?"
rm -f /tmp/l8b.gguf
bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o /tmp/q30.gguf > /dev/null 2>&1
{ echo "== qwen3-30b-a3b shape"; timeout 200 $B/bench-decode -m /tmp/q30.gguf --device gpu --pp 512 --tg 128 --runs 3 --warmup 1; } >> $OUT/bench.log 2>&1; echo "bench 30b exit $?"
cat $OUT/bench.log | grep -E "==|tok/s|reserved|outside|process device"
