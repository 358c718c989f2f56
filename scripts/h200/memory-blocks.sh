#!/usr/bin/env bash
# Device weights as one block and a KV cache's fixed buffers as one allocation (issue 23's and
# 24's memory rows). In phases, each in the foreground of one device call (a lease ends 30 s
# after its last call):
#   tests  while llama.cpp builds and the 8B shape is synthesized in the background: the GPU
#          tests the change touches (layout, whose GPU case checks the layout's replay against
#          the allocator per tag and in peak reserved; gpu_backend, backend_conformance,
#          generate_many, step_batch, offload_run, golden_tokens);
#   mem    each process alone, nvidia-smi sampling its used_memory every 50 ms: the 8B shape at
#          32k context (bench-decode -p 0 -n 64 -d 32000 -r 1 -ctk T against llama-bench
#          -p 0 -n 64 -d 32000 -fa 1 -ngl 99 -r 1 -ctk T -ctv T, T = f16 and q8_0), then
#          pp512/tg128 (bench-decode -p 512 -n 128 -r 3 against llama-bench -p 512 -n 128 -ngl
#          99 -fa 1 -r 3), ours and llama.cpp alternating; the parent's binary once per KV type.
# From the checkout root, with bundle-m/{bench-decode,xtask}, bundle-m2/old-bench-decode (the parent,
# ee90697), bundle-m/tests and .peer:
#   bash scripts/h200/memory-blocks.sh tests|mem; ... collect
# Logs under /tmp/mb; collect packs them into $OUT/mb.tgz and prints the summary.
set -u
D=/tmp/mb
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/mb.tgz" -C /tmp mb 2>/dev/null
    cat $D/summary.txt 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-m
L=/tmp/llama3-8b-q4_k_m.gguf
LB=/tmp/llama/b/bin
source scripts/h200/lease.sh
case "${1:-}" in
tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done" </dev/null >/dev/null 2>&1 &)
    st started
    for t in ${TESTS:-layout gpu_backend backend_conformance generate_many step_batch offload_run golden_tokens}; do
        case $t in
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        golden_tokens) run decode golden_tokens gpu ;;
        layout) run decode layout --nocapture --test-threads=1 ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    ;;
mem)
    for _ in $(seq 1 300); do [ -f /tmp/llama/BUILD_RC ] && [ -f $D/synth.done ] && break; sleep 1; done
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    for t in f16 q8_0; do
        # The parent's binary (one allocation per weight and per KV buffer), once per type.
        peak d32k-parent-$t timeout 200 bundle-m2/old-bench-decode -m $L --device gpu -p 0 -n 64 \
            -d 32000 -r 1 -ctk $t
        peak d32k-ours-$t-1 timeout 200 $N/bench-decode -m $L --device gpu -p 0 -n 64 -d 32000 \
            -r 1 -ctk $t
        peak d32k-llama-$t-1 timeout 200 $LB/llama-bench -m $L -p 0 -n 64 -d 32000 -fa 1 -ngl 99 \
            -r 1 -ctk $t -ctv $t
        peak d32k-llama-$t-2 timeout 200 $LB/llama-bench -m $L -p 0 -n 64 -d 32000 -fa 1 -ngl 99 \
            -r 1 -ctk $t -ctv $t
        peak d32k-ours-$t-2 timeout 200 $N/bench-decode -m $L --device gpu -p 0 -n 64 -d 32000 \
            -r 1 -ctk $t
    done
    peak pp-ours-1 timeout 100 $N/bench-decode -m $L --device gpu -p 512 -n 128 -r 3
    peak pp-llama-1 timeout 100 $LB/llama-bench -m $L -p 512 -n 128 -ngl 99 -fa 1 -r 3
    peak pp-ours-2 timeout 100 $N/bench-decode -m $L --device gpu -p 512 -n 128 -r 3
    st mem-done
    ;;
*)
    echo "usage: $0 tests|mem|collect" >&2
    exit 2
    ;;
esac
