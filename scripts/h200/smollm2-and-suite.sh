#!/usr/bin/env bash
# SmolLM2-135M-Instruct on the GPU through `run`, `chat` and `bench-decode`, `hipdecode
# selftest`, and the GPU test binaries the session's changes touch, with the GPU required.
#
# From the checkout root, with the model in three parts (bundle-p1..3, `split -n 3 -d` of
# models/smollm2-135m-instruct-q4_1.gguf, carried over back-to-back calls) and bundle-f/
# holding hipdecode, bench-decode and the test binaries (release, stripped):
#   setsid bash scripts/h200/smollm2-and-suite.sh &
# Logs land in /tmp/logs (copy them to $OUT); "all-done" ends summary.txt.
set -u
L=/tmp/logs
mkdir -p "$L" models
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
M=models/smollm2-135m-instruct-q4_1.gguf
cat bundle-p1/smol.part00 bundle-p2/smol.part01 bundle-p3/smol.part02 >"$M"
sha256sum "$M" >"$L/model-sha256.txt"
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p target/release && cp bundle-f/hipdecode target/release/hipdecode
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
H=bundle-f/hipdecode
step() { # name command...
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$L/$name.out" 2>"$L/$name.err"
    echo "$name exit $? $((SECONDS - t0))s" >>"$L/summary.txt"
}
step selftest $H selftest
step run $H run -m "$M" --device gpu --temp 0 -n 48 -p "The three primary colors are"
printf 'What is the capital of France?\nAnd of Italy? Answer in one sentence.\n/exit\n' >/tmp/chat-input.txt
step chat sh -c "$H chat -m $M --device gpu --temp 0 -n 40 </tmp/chat-input.txt"
# The bench in the background, so that nvidia-smi's per-process view of it can be read
# beside its own pid (does NVML see this PID namespace's pids?).
t0=$SECONDS
bundle-f/bench-decode -m "$M" --device gpu -p 512 -n 128 -r 5 >"$L/bench.out" 2>"$L/bench.err" &
bench=$!
sleep 4
{
    echo "bench pid $bench; NSpid: $(grep NSpid /proc/$bench/status)"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
} >"$L/compute-apps.txt" 2>&1
wait $bench
echo "bench exit $? $((SECONDS - t0))s" >>"$L/summary.txt"
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    (cd "crates/$crate" && timeout 300 "../../bundle-f/tests/$bin"-* "$@" --test-threads=1 \
        >"$L/$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$L/$bin.log" | tail -1)" \
        >>"$L/summary.txt"
}
run hip-ffi gpu --nocapture
run rocm-kernels gpu_selftest
run rocm-kernels gpu_quant
run cli selftest
run decode gpu_backend --nocapture
run decode golden_tokens --nocapture
run decode backend_conformance
run decode step_batch
run decode layout
run decode capture_stream
echo all-done >>"$L/summary.txt"
