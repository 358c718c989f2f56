#!/usr/bin/env bash
# The int8 matrix-core products for batched decode (issue 21): steps of 9 to 64 token rows read
# the quantized weights in their GGUF blocks against 8-bit activations (matmul_q8_mma), where
# they took the vendor GEMM and its f16 copy of every weight. One binary, two arms:
# HIPDECODE_GPU_INT8_MMA_ROWS=0 is the old path. llama.cpp in the same lease. In phases, each
# run in the foreground of one device call (a lease ends 30 s after its last call):
#   tests   the kernels' self-test (the new cases: every format at odd shapes, split and whole,
#           native against SIMT), the batched and conformance tests, the golden GPU tokens (on
#           a difference, blessed to a file for reading), while llama.cpp builds and the 8B
#           shape is synthesized (both in the background);
#   ab      bench-decode --ab (old arm first) over --npl 1,8,16,32,64 --npp 128 --ntg 128, two
#           rounds, then per-op profiles of 8 decode steps of 32 sequences, both arms;
#   peer    this build's batched run and llama-batched-bench (the command),
#           alternating, nvidia-smi sampling memory.used every 100 ms.
# TESTS lists the test binaries of the tests phase (default: all five); AB_NPL the batch sizes
# of the A/B (default: those of the peer phase); PROFILE_ROWS the arms profiled (0 64).
# From the checkout root, with bundle-m/{bench-decode,hipdecode,xtask} and bundle-m/tests (this
# build, release, stripped) and .peer (llama.cpp's source and build script):
#   bash scripts/h200/int8-mma.sh tests|ab|peer; bash scripts/h200/int8-mma.sh collect
# Logs under /tmp/im; collect packs them into $OUT/im.tgz and prints the summary.
set -u
D=/tmp/im
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/im.tgz" -C /tmp im 2>/dev/null
    cat $D/summary.txt $D/status 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-m
L=/tmp/llama3-8b-q4_k_m.gguf
LB=/tmp/llama/b/bin
NPL=1,8,16,32,64
st() { echo "$* at $(date -u +%T)" >>$D/summary.txt; }
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 300 ../../$N/tests/"$bin"-* "$@" \
        >$D/test-$bin.log 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' $D/test-$bin.log | tail -1)"
}
case "${1:-}" in
tests)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
        >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    [ -d /tmp/llama/b ] || bash .peer/build-on-device.sh >$D/llama-build.log 2>&1
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done" </dev/null >/dev/null 2>&1 &)
    st started
    for t in ${TESTS:-gpu_selftest step_batch generate_many backend_conformance golden_tokens}; do
        case $t in
        gpu_selftest) run rocm-kernels gpu_selftest --nocapture ;;
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        golden_tokens) run decode golden_tokens gpu_greedy ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    # A self-test built with Q6_K's second scale read from the first's byte must fail.
    if [ -x $N/broken/gpu_selftest-broken ]; then
        (cd crates/rocm-kernels && HIPDECODE_REQUIRE_GPU=1 timeout 300 \
            ../../$N/broken/gpu_selftest-broken --nocapture >$D/test-broken.log 2>&1)
        st "broken self-test exit $? (must fail): $(grep -c '^FAIL' $D/test-broken.log) failed cases"
    fi
    if [ -f $D/test-golden_tokens.log ] && ! grep -q "test result: ok" $D/test-golden_tokens.log; then
        (cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json \
            timeout 300 ../../$N/tests/golden_tokens-* gpu_greedy >$D/golden-bless.log 2>&1)
        st "golden bless exit $?"
    fi
    ;;
ab)
    for i in $(seq 1 150); do [ -f $D/synth.done ] && break; sleep 2; done
    st "8B shape written"
    timeout 500 $N/bench-decode -m $L --device gpu --npl ${AB_NPL:-$NPL} --npp 128 --ntg 128 \
        --ab "HIPDECODE_GPU_INT8_MMA_ROWS=0" "" --rounds 2 >$D/ab-batched.md 2>&1
    st "ab batched exit $?"
    for rows in ${PROFILE_ROWS:-0 64}; do
        HIPDECODE_GPU_INT8_MMA_ROWS=$rows timeout 60 $N/hipdecode profile -m $L -b 32 -p 128 \
            -n 8 >$D/profile-rows$rows-b32.txt 2>&1
        st "profile rows $rows exit $?"
    done
    ;;
peer)
    LOGS=$D
    source scripts/h200/sampled.sh
    ours() { sampled $1 timeout 200 $N/bench-decode -m $L --device gpu --npl $NPL --npp 128 \
        --ntg 128; }
    llama() { sampled $1 timeout 200 $LB/llama-batched-bench -m $L -c 20480 -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on; }
    for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    ours new-1
    llama llama-1
    llama llama-2
    ours new-2
    st peer-done
    ;;
*)
    echo "usage: $0 tests|ab|peer|collect" >&2
    exit 2
    ;;
esac
