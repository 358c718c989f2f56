#!/usr/bin/env bash
# The process's device memory as nvidia-smi lists it, ours against llama.cpp's in the same
# lease: bench-decode (whose `per process (smi)` column reads the same NVML figure) and
# llama-bench on the synthetic Gemma 3 270M and Llama 3.1 8B Q4_K_M shapes, each process's peak
# sampled every 50 ms (`nvidia-smi --query-compute-apps -lms 50`), ours first, then llama.cpp,
# then ours again.
#
# From the checkout root, with bundle-m/{bench-decode,xtask} (release, stripped) and .peer/
# (a copy of ../shared/tools/llama.cpp):
#   setsid bash scripts/h200/memory-per-process.sh &
# Logs land in /tmp/logs-mem; "all-done" ends summary.txt.
set -u
L=/tmp/logs-mem
mkdir -p "$L"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
bash .peer/build-on-device.sh >"$L/llama-build.txt" 2>&1
G=/tmp/gemma3-270m-q4_k_m.gguf
M8=/tmp/llama3-8b-q4_k_m.gguf
bundle-m/xtask synth-model gemma3-270m-q4_k_m -o $G >"$L/synth.log" 2>&1
bundle-m/xtask synth-model llama3-8b-q4_k_m -o $M8 >>"$L/synth.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
peak() { # label command...
    local label=$1
    shift
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 50 \
        >"$L/$label.smi" 2>/dev/null &
    local sampler=$!
    "$@" >"$L/$label.out" 2>&1
    local rc=$?
    sleep 0.2
    kill $sampler
    local max
    max=$(awk -F, '{gsub(/ /, "", $2); if ($2 + 0 > m) m = $2 + 0} END {print m + 0}' "$L/$label.smi")
    echo "$label exit $rc nvidia-smi peak $max MiB" >>"$L/summary.txt"
}
ours() { peak "ours-$1-$3" bundle-m/bench-decode -m "$2" --device gpu -p 512 -n 128 -r 3; }
peer() {
    peak "llama-$1" /tmp/llama/b/bin/llama-bench -m "$2" -p 512 -n 128 -ngl 99 -fa 1 -r 3
}
ours gemma $G 1
ours 8b $M8 1
for _ in $(seq 1 90); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)" >>"$L/summary.txt"
peer gemma $G
peer 8b $M8
ours gemma $G 2
ours 8b $M8 2
echo all-done >>"$L/summary.txt"
