#!/usr/bin/env bash
# Run 3: the decode GPU-vs-CPU tests with their measured tolerances printed, real Gemma and the
# real-shape synthetic models included.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/
[ -e /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
bundle/xtask synth-model llama3-8b-q4_k_m -o /tmp/l8b.gguf > /dev/null 2>&1
bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o /tmp/q30.gguf > /dev/null 2>&1
export HIPDECODE_SYNTH_MODELS=/tmp/l8b.gguf:/tmp/q30.gguf
T=$(ls bundle/tests/gpu_backend-*)
(cd crates/decode && ../../$T --nocapture --test-threads=1) > $OUT/gpu_backend.log 2>&1; echo "gpu_backend exit $?"
grep -E "max \||parts|finite|test result|FAILED|panicked|SKIP|skipping" $OUT/gpu_backend.log
