#!/usr/bin/env bash
# H200: the decode-speed round. verify-rocm with the GPU and the vendor library required, the
# GPU-vs-CPU model tests, bench-decode over the three models (-p 512 -n 128 -r 5) with the
# memory timeline, A/B runs of the matrix-vector depth (HIPDECODE_MATVEC_DEPTH 2 against 4) and
# grid cap, and of programmatic dependent launch (HIPDECODE_GPU_PDL off against auto), per-op
# decode profiles, and Nsight Compute on a few matrix-vector launches
# (where the machine's runtime lets ncu read counters). Logs under $OUT. Needs the real Gemma
# file at /tmp/gemma3-270m-q4_k_m.gguf (see README.md).
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
grep -E "max \||greedy|test result|panicked" $OUT/gpu_backend.log | head -40
timeout 240 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 5 --device gpu \
  --svg $OUT/memory-timeline.svg > $OUT/bench.md 2>&1; echo "bench exit $?"
cat $OUT/bench.md
# The kernel tests again with both matrix-vector knobs away from their defaults (deeper loads,
# and a grid capped at one block per multiprocessor, so every warp strides over many rows).
for t in gpu_quant gpu_basic; do
  TB=$(ls bundle/tests/$t-* | head -1)
  (cd crates/rocm-kernels && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_MATVEC_DEPTH=4 \
    HIPDECODE_MATVEC_BLOCKS_PER_SM=1 timeout 120 ../../$TB --test-threads=1) > $OUT/knobs-$t.log 2>&1
  echo "$t with knobs exit $?"; grep -E "test result|FAILED|panicked" $OUT/knobs-$t.log | head -5
done
{ for f in $L $Q; do timeout 150 $B/bench-decode -m $f -p 0 -n 128 --device gpu --rounds 3 \
    --ab 'HIPDECODE_MATVEC_DEPTH=2' 'HIPDECODE_MATVEC_DEPTH=4'; echo; done
  timeout 150 $B/bench-decode -m $L -p 0 -n 128 --device gpu --rounds 3 \
    --ab 'HIPDECODE_MATVEC_BLOCKS_PER_SM=0' 'HIPDECODE_MATVEC_BLOCKS_PER_SM=8'; echo
  for f in $G $L $Q; do timeout 150 $B/bench-decode -m $f -p 0 -n 128 --device gpu --rounds 3 \
    --ab 'HIPDECODE_GPU_PDL=off' 'HIPDECODE_GPU_PDL=auto'; echo; done; } > $OUT/ab-matvec.txt 2>&1
echo "ab exit $?"; grep -E "verdict|\| (A|B) " $OUT/ab-matvec.txt
{ for f in $G $L $Q; do timeout 60 $B/hipdecode profile -m $f -p 64 -n 8; echo; done; } > $OUT/profiles.md 2>&1
echo "profiles exit $?"; cat $OUT/profiles.md | head -150
# Counters of the 8B's matrix-vector launches in eager decode steps (the profile's), skipping
# the prefill and the first steps.
if command -v ncu > /dev/null; then
  timeout 150 ncu --clock-control none -k regex:matvec_q8_one --launch-skip 300 --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats \
    $B/hipdecode profile -m $L -p 16 -n 4 > $OUT/ncu-matvec.txt 2>&1
  echo "ncu exit $?"
  grep -E "matvec_q8|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Theoretical Occ|Stall|Warp Cycles Per Issued|Issued Ipc|Block Limit" $OUT/ncu-matvec.txt | head -120
fi
