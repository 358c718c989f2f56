#!/usr/bin/env bash
# H200: the closing decode-speed run. verify-rocm with the GPU and the vendor library required
# (the GPU-vs-CPU model tests included), bench-decode over the three models (-p 512
# -n 128 -r 5) with the memory timeline, per-op decode profiles, and a Gemma run of the CLI.
# Logs under $OUT, packed into one archive (the device tool returns a handful of files). Needs
# the real Gemma file at /tmp/gemma3-270m-q4_k_m.gguf (see README.md).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_BLAS=1
B=bundle/bin
G=models/gemma3-270m-q4_k_m.gguf
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
D=$OUT/decode-final
mkdir -p models $D && cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
HIPDECODE_REQUIRE_GPU=1 bundle/run.sh > $D/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL|panicked|skipped" $D/verify.log | tail -12
wait
timeout 240 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 5 --device gpu \
  --svg $D/memory-timeline.svg > $D/bench.md 2>&1; echo "bench exit $?"
grep -E "^\| (model|gemma|llama|qwen)" $D/bench.md | head -12
{ for f in $G $L $Q; do timeout 60 $B/hipdecode profile -m $f -p 64 -n 8; echo; done; } > $D/profiles.md 2>&1
echo "profiles exit $?"; grep -E "^model|per-op|warning" $D/profiles.md
timeout 60 $B/hipdecode run -m $G -p "The history of computing began" -n 48 --temp 0 --device gpu \
  > $D/gemma-run.txt 2>&1; echo "gemma run exit $?"; tail -12 $D/gemma-run.txt
# Counters of the 8B's matrix-vector launches in eager decode steps (the profile's), skipping
# the prefill and the first steps (where the machine's runtime lets ncu read them).
if command -v ncu > /dev/null; then
  timeout 150 ncu --clock-control none -k regex:matvec_q8_one --launch-skip 300 --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    $B/hipdecode profile -m $L -p 16 -n 4 > $D/ncu-matvec.txt 2>&1
  echo "ncu exit $?"
  grep -E "matvec_q8|Duration|DRAM Throughput|Compute \(SM\)|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" $D/ncu-matvec.txt | head -60
fi
tar czf $OUT/decode-final.tgz -C $OUT decode-final && rm -rf $D
