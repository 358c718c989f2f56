#!/usr/bin/env bash
# The second flash prefill kernel, with its scores in registers (attn_prefill_mma_regs_*,
# HIPDECODE_GPU_ATTN_PREFILL=flash-regs), against the first (flash), for issue 23's pp4096 row.
# Written on 2026-12-07; no device could be started after the kernel was, so it has not run.
# In phases, each in the foreground of one device call:
#   setup  starts llama.cpp's build and the 8B and 30B-A3B shapes' synthesis in the background
#          (bundle/xtask and .peer carried), then the GPU tests: the self-test's attention cases
#          (both flash kernels, native and SIMT builds, against the reference), gpu_attention
#          and gpu_basic;
#   tests  the engine's GPU tests named in $TESTS;
#   ab8b, ab30b  `--ab` of the two kernels at pp512 and pp4096 on the 8B and 30B-A3B shapes;
#   block  issue 21's KV block size: batched runs at 16 positions against 32 and 64;
#   profile the per-op profile of the 8B shape's 4096-token prefill on each kernel;
#   peer   llama-bench on the same rows (the peer, same lease);
#   collect copies the log folder into $OUT and prints the summary.
# Several phases may be named in one call; the logs stay in /tmp/fr on the warm machine. For a
# short lease, short-lease.sh runs the verdict first with its logs under $OUT.
# From the checkout root, with $BUNDLE (default bundle) holding hipdecode, bench-decode, xtask
# and tests/ (release test binaries), carried over the calls.
set -u
D=${FR_DIR:-/tmp/fr}
if [ "${1:-}" = collect ]; then
    cp -r "$D" "$OUT/" 2>/dev/null
    cat $D/summary.txt 2>/dev/null
    exit 0
fi
mkdir -p $D /tmp/bh
export HIPDECODE_KERNEL_CACHE=/tmp/kcache NCCL_NVLS_ENABLE=0
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
LB=/tmp/llama/b/bin
N=/tmp/bh
source scripts/h200/lease.sh
[ -d "${BUNDLE:-bundle}" ] && cp -r ${BUNDLE:-bundle}/. $N/
synth() {
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done; $N/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q \
        >$D/synth-q.log 2>&1; echo done >$D/synth-q.done" </dev/null >/dev/null 2>&1 &)
}
selftest_attention() {
    timeout 150 $N/hipdecode selftest --filter attention --no-models >$D/selftest-attention.txt 2>&1
    st "selftest --filter attention exit $?"
}
ab() { # model tests: the two kernels, alternating, in fresh processes
    timeout 400 $N/bench-decode -m $1 --device gpu $2 -n 0 -r 3 \
        --ab "HIPDECODE_GPU_ATTN_PREFILL=flash" "HIPDECODE_GPU_ATTN_PREFILL=flash-regs" \
        --rounds 2 >$D/ab-$(basename $1 .gguf).md 2>&1
    st "a/b $(basename $1 .gguf) exit $?"
}
for phase in "$@"; do
case $phase in
setup)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
        >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    synth
    st started
    selftest_attention
    run rocm-kernels gpu_attention
    run rocm-kernels gpu_basic
    ;;
tests)
    for t in ${TESTS:-gpu_long_context gpu_backend backend_conformance step_batch batched_runs golden_tokens}; do
        case $t in
        golden_tokens) run decode golden_tokens gpu ;;
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    ;;
ab8b)
    wait_for $D/synth.done 300 && ab $L "-p 512,4096" || st "8B shape not written"
    ;;
ab30b)
    wait_for $D/synth-q.done 400 && ab $Q "-p 512,4096" || st "30B-A3B shape not written"
    ;;
block)
    # Issue 21's block size: batched decode and prefill of the 8B shape at 16 positions a
    # block against 32 and 64 (HIPDECODE_KV_BLOCK), alternating.
    wait_for $D/synth.done 300 || st "8B shape not written"
    for b in 32 64; do
        timeout 280 $N/bench-decode -m $L --device gpu --npl 8,32 --npp 512 --ntg 128 \
            --ab "HIPDECODE_KV_BLOCK=16" "HIPDECODE_KV_BLOCK=$b" --rounds 2 \
            >$D/block-16-$b.md 2>&1
        st "block 16/$b exit $?"
    done
    ;;
profile)
    for k in flash flash-regs; do
        HIPDECODE_GPU_ATTN_PREFILL=$k timeout 200 $N/hipdecode profile -m $L -p 4096 --prefill \
            >$D/profile-8b-pp4096-$k.md 2>&1
        st "profile $k exit $?"
    done
    ;;
peer)
    wait_for /tmp/llama/BUILD_RC 240
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    for m in $L $Q; do
        timeout 300 $LB/llama-bench -m $m -p 512,4096 -n 0 -ngl 99 -fa 1 -r 3 \
            >$D/llama-$(basename $m .gguf).md 2>&1
        st "llama-bench $(basename $m .gguf) exit $?"
    done
    ;;
*)
    echo "usage: $0 PHASE... (setup tests ab8b ab30b block profile peer) | collect" >&2
    exit 2
    ;;
esac
done
