#!/usr/bin/env bash
# H200, speed work run 1: verify-rocm with the GPU required, the GPU-vs-CPU tests with their
# measured errors, then Gemma 3 270M: bench-decode (-r 5), an A/B of the exact path against the
# int8 + f16-KV defaults, and the per-op profile. Logs under $OUT.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
G=models/gemma3-270m-q4_k_m.gguf
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
bundle/run.sh > $OUT/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL|panicked" $OUT/verify.log | tail -12
T=$(ls bundle/tests/gpu_backend-* | head -1)
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 ../../$T --nocapture --test-threads=1) > $OUT/gpu_backend.log 2>&1
echo "gpu_backend exit $?"; grep -E "max \||greedy|test result" $OUT/gpu_backend.log | head -40
$B/bench-decode -m $G -p 512 -n 128 -r 5 --device gpu > $OUT/bench-gemma.md 2>&1; echo "bench exit $?"
cat $OUT/bench-gemma.md | head -30
$B/hipdecode profile -m $G -p 64 -n 16 > $OUT/profile-gemma.md 2>&1; echo "profile exit $?"
head -40 $OUT/profile-gemma.md
$B/bench-decode -m $G -p 0 -n 128 --device gpu --rounds 4 \
  --ab 'HIPDECODE_GPU_MATVEC=exact -ctk f32' '' > $OUT/ab-gemma.txt 2>&1; echo "ab exit $?"
tail -12 $OUT/ab-gemma.txt
# Which vendor BLAS libraries the image has (for a prefill GEMM path).
{ find / \( -name 'libcublas*.so*' -o -name 'libcublasLt*.so*' -o -name 'libhipblas*.so*' \) \
    -not -path '/proc/*' 2>/dev/null | head -20; } > $OUT/blas-libs.txt
cat $OUT/blas-libs.txt
