#!/usr/bin/env bash
# H200, the final run of the speed work: verify-rocm with the GPU required, the GPU-vs-CPU
# model tests (both matvec paths) with their measured errors, bench-decode over the three
# models in one table (-p 512 -n 128 -r 5) with the memory timeline, the per-op profiles,
# A/B runs of the exact path against the defaults, and the real-shape test. Logs under $OUT
# (few files: the device tool returns a limited number).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
G=models/gemma3-270m-q4_k_m.gguf
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $OUT/gpu.txt 2>&1
bundle/run.sh > $OUT/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL|panicked" $OUT/verify.log | tail -8
T=$(ls bundle/tests/gpu_backend-* | head -1)
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 ../../$T --nocapture --test-threads=1) > $OUT/gpu_backend.log 2>&1
echo "gpu_backend exit $?"
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_SYNTH_MODELS=$L:$Q \
  timeout 200 ../../$T real_shape --nocapture --test-threads=1) >> $OUT/gpu_backend.log 2>&1
echo "real-shape exit $?"
grep -E "max \||greedy|finite|test result" $OUT/gpu_backend.log | head -60
timeout 240 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 5 --device gpu \
  --svg $OUT/memory-timeline.svg > $OUT/bench.md 2>&1; echo "bench exit $?"
cat $OUT/bench.md
{ for f in $G $L $Q; do timeout 60 $B/hipdecode profile -m $f -p 64 -n 8; echo; done; } > $OUT/profiles.md 2>&1
echo "profiles exit $?"; grep -E "^model|per-op|warning" $OUT/profiles.md
{ for f in $G $L; do timeout 150 $B/bench-decode -m $f -p 0 -n 128 --device gpu --rounds 4 \
    --ab 'HIPDECODE_GPU_MATVEC=exact -ctk f32' ''; echo; done; } > $OUT/ab.txt 2>&1
echo "ab exit $?"; grep -E "verdict|\| (A|B) " $OUT/ab.txt
