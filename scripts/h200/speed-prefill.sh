#!/usr/bin/env bash
# H200: the prefill work on the vendor GEMM. verify-rocm with the GPU and the vendor library
# required, the GPU-vs-CPU model tests, bench-decode over the three models (-p 512 -n 128 -r 5)
# with the memory timeline, an A/B of the two prefill attention kernels, and a
# per-op profile of a 512-token prefill. Logs under $OUT (few files: the device tool returns a
# limited number). Needs the real Gemma file at /tmp/gemma3-270m-q4_k_m.gguf (see README.md).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_BLAS=1
B=bundle/bin
G=models/gemma3-270m-q4_k_m.gguf
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $OUT/gpu.txt 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
bundle/run.sh > $OUT/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL|panicked" $OUT/verify.log | tail -8
wait
T=$(ls bundle/tests/gpu_backend-* | head -1)
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_SYNTH_MODELS=$L:$Q \
  timeout 300 ../../$T --nocapture --test-threads=1) > $OUT/gpu_backend.log 2>&1
echo "gpu_backend exit $?"
grep -E "max \||greedy|finite|test result|BLASLt|panicked" $OUT/gpu_backend.log | head -70
timeout 200 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 5 --device gpu \
  --svg $OUT/memory-timeline.svg > $OUT/bench.md 2>&1; echo "bench exit $?"
cat $OUT/bench.md
# The two prefill attention kernels: the one-query-per-block kernel against the tiled one.
{ for f in $G $L $Q; do timeout 120 $B/bench-decode -m $f -p 512 -n 0 --device gpu --rounds 3 \
    --ab 'HIPDECODE_GPU_ATTN_PREFILL=per-query' ''; echo; done; } > $OUT/ab.txt 2>&1
echo "ab exit $?"; grep -E "verdict|\| (A|B) " $OUT/ab.txt
{ for f in $G $L $Q; do timeout 60 $B/hipdecode profile -m $f -p 512 --prefill; echo; done; } > $OUT/profiles.md 2>&1
echo "profiles exit $?"; grep -E "^model|per-op|warning|gemm|moe|attention" $OUT/profiles.md | head -40
# The main job on the GPU: a Gemma run with its tok/s and memory report.
timeout 60 $B/hipdecode run -m $G -p "The history of computing began" -n 48 --temp 0 --device gpu \
  > $OUT/gemma-run.txt 2>&1; echo "gemma run exit $?"; tail -30 $OUT/gemma-run.txt
