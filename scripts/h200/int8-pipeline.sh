#!/usr/bin/env bash
# The pipelined int8 matrix-core products (issue 21): matmul_q8_mma issues every global load of
# step k + 1 before step k's products, where it loaded one item at a time; greedy rows take
# one argmax launch and one read per step; and the grouped MoE prefill runs its experts on the
# int8 kernel in one launch per projection (issue 23 c), where it took the vendor GEMM per
# expert over f16 copies. Old arm: the parent's kernel (bundle-m, built at
# 8cc2bc2; the kernel source is unchanged up to ba6e033), new arm: this build. In phases, each in
# the foreground of one device call (a lease ends 30 s after its last call):
#   tests   the kernels' self-test, the conformance, batched and golden-token tests (blessed to a
#           file for reading on a difference), while llama.cpp builds and the 8B shape is
#           synthesized in the background;
#   ab      old and new binaries alternating, twice, at --npl 16,32,64 with the int8 products
#           taking up to 64 rows; then this build's --ab of the vendor GEMM against the int8
#           products at --npl 48,64 (where the cap belongs); a profile of 8 steps of 32;
#   moe     the 30B-A3B shape: pp512 and batched decode at 32 and 64 with
#           HIPDECODE_GPU_MOE_GROUPED=vendor against the default (--ab, two rounds), and
#           llama-bench -p 512 -n 0 alternating with this build;
#   moe-peer  the 30B-A3B shape batched, this build and llama-batched-bench alternating;
#   peer    this build and llama-batched-bench (the command), alternating, nvidia-smi
#           sampling memory.used every 100 ms.
# From the checkout root, with bundle-r/{bench-decode,hipdecode,xtask,old-bench-decode} and
# bundle-r/tests (release, stripped) and .peer (llama.cpp's source and build script):
#   bash scripts/h200/int8-pipeline.sh tests|ab|moe|moe-peer|peer; bash scripts/h200/int8-pipeline.sh collect
# Logs under /tmp/ip; collect packs them into $OUT/ip.tgz and prints the summary.
# On 2026-12-06 (H200) the moe phase's batched A/B first ran with --rounds 1, which the bench
# refuses; it and the moe-peer phase were then run by hand with these commands.
set -u
D=/tmp/ip
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/ip.tgz" -C /tmp ip 2>/dev/null
    cat $D/summary.txt $D/status 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-r
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
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
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done; $N/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q \
        >$D/synth-q.log 2>&1; echo done >$D/synth-q.done" </dev/null >/dev/null 2>&1 &)
    st started
    for t in ${TESTS:-gpu_selftest backend_conformance gpu_backend step_batch generate_many golden_tokens}; do
        case $t in
        gpu_selftest) run rocm-kernels gpu_selftest --nocapture ;;
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        golden_tokens) run decode golden_tokens gpu_greedy ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    if [ -f $D/test-golden_tokens.log ] && ! grep -q "test result: ok" $D/test-golden_tokens.log; then
        (cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json \
            timeout 300 ../../$N/tests/golden_tokens-* gpu_greedy >$D/golden-bless.log 2>&1)
        st "golden bless exit $?"
    fi
    ;;
ab)
    for i in $(seq 1 150); do [ -f $D/synth.done ] && break; sleep 2; done
    st "8B shape written"
    bench() { # arm binary
        HIPDECODE_GPU_INT8_MMA_ROWS=64 timeout 200 $2 -m $L --device gpu --npl 16,32,64 \
            --npp 128 --ntg 128 >$D/ab-$1.md 2>&1
        st "ab $1 exit $?"
    }
    bench old-1 $N/old-bench-decode
    bench new-1 $N/bench-decode
    bench old-2 $N/old-bench-decode
    bench new-2 $N/bench-decode
    timeout 400 $N/bench-decode -m $L --device gpu --npl 48,64 --npp 128 --ntg 128 \
        --ab "HIPDECODE_GPU_INT8_MMA_ROWS=0" "HIPDECODE_GPU_INT8_MMA_ROWS=64" --rounds 2 \
        >$D/ab-cap.md 2>&1
    st "ab cap exit $?"
    timeout 60 $N/hipdecode profile -m $L -b 32 -p 128 -n 8 >$D/profile-b32.txt 2>&1
    st "profile exit $?"
    ;;
moe)
    for i in $(seq 1 150); do [ -f $D/synth-q.done ] && break; sleep 2; done
    st "30B-A3B shape written"
    timeout 300 $N/bench-decode -m $Q --device gpu -p 512 -n 0 -r 3 \
        --ab "HIPDECODE_GPU_MOE_GROUPED=vendor" "" --rounds 2 >$D/moe-pp512.md 2>&1
    st "moe pp512 ab exit $?"
    timeout 300 $N/bench-decode -m $Q --device gpu --npl 32,64 --npp 128 --ntg 64 \
        --ab "HIPDECODE_GPU_MOE_GROUPED=vendor" "" --rounds 2 >$D/moe-batched.md 2>&1
    st "moe batched ab exit $?"
    for i in 1 2; do
        timeout 120 $LB/llama-bench -m $Q -p 512 -n 0 -ngl 99 -fa 1 -r 3 >$D/moe-llama-$i.md 2>&1
        st "llama-bench 30B pp512 exit $?"
        timeout 120 $N/bench-decode -m $Q --device gpu -p 512 -n 0 -r 3 >$D/moe-ours-$i.md 2>&1
        st "ours 30B pp512 exit $?"
    done
    ;;
moe-peer)
    LOGS=$D
    source scripts/h200/sampled.sh
    ours() { sampled $1 timeout 150 $N/bench-decode -m $Q --device gpu --npl 1,8,32,64 --npp 128 \
        --ntg 128; }
    llama() { sampled $1 timeout 150 $LB/llama-batched-bench -m $Q -c 20480 -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on; }
    llama moe-peer-llama-1
    ours moe-peer-ours-1
    ours moe-peer-ours-2
    llama moe-peer-llama-2
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
    echo "usage: $0 tests|ab|moe|moe-peer|peer|collect" >&2
    exit 2
    ;;
esac
