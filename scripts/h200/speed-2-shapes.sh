#!/usr/bin/env bash
# H200, speed work run 2: the Llama-3.1-8B and Qwen3-30B-A3B Q4_K_M shapes, synthesized here:
# bench-decode (-r 5), the per-op profile, an A/B of the exact path against the defaults on
# the 8B, and the real-shape GPU-vs-CPU test. Logs under $OUT.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
for preset in llama3-8b-q4_k_m qwen3-30b-a3b-q4_k_m; do
  f=/tmp/$preset.gguf
  [ -f $f ] || bundle/xtask synth-model $preset -o $f > /dev/null 2>&1
  timeout 120 $B/bench-decode -m $f -p 512 -n 128 -r 5 --device gpu > $OUT/bench-$preset.md 2>&1
  echo "bench $preset exit $?"; head -12 $OUT/bench-$preset.md
  timeout 60 $B/hipdecode profile -m $f -p 64 -n 8 > $OUT/profile-$preset.md 2>&1
  echo "profile $preset exit $?"; head -24 $OUT/profile-$preset.md
done
f=/tmp/llama3-8b-q4_k_m.gguf
timeout 150 $B/bench-decode -m $f -p 0 -n 128 --device gpu --rounds 4 \
  --ab 'HIPDECODE_GPU_MATVEC=exact -ctk f32' '' > $OUT/ab-8b.txt 2>&1
echo "ab exit $?"; tail -8 $OUT/ab-8b.txt
T=$(ls bundle/tests/gpu_backend-* | head -1)
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 \
  HIPDECODE_SYNTH_MODELS=/tmp/llama3-8b-q4_k_m.gguf:/tmp/qwen3-30b-a3b-q4_k_m.gguf \
  timeout 200 ../../$T real_shape --nocapture --test-threads=1) > $OUT/real-shape.log 2>&1
echo "real-shape exit $?"; grep -E "max \||finite|test result|panicked" $OUT/real-shape.log
