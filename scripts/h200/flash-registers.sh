#!/usr/bin/env bash
# Flash prefill with the scores and probabilities in registers (attention_mma.hip), issue 23's
# pp4096 row. In phases, each in the foreground of one device call:
#   setup  starts llama.cpp's build and the 8B and 30B-A3B shapes' synthesis in the background
#          (bundle-h/xtask, .peer carried), keeps the carried test binaries, then the GPU tests
#          of the change: the kernel self-test (flash native and SIMT builds against the
#          reference), gpu_attention, gpu_basic, and the engine's tests that prefill on it;
#   bench  this build's bench-decode (bundle-h) against the parent's (bundle-g), alternating
#          A B B A, pp512 and pp4096 on the 8B and 30B-A3B shapes, then llama-bench on the same
#          rows, then the per-op profile of the 8B shape's 4096-token prefill on both builds;
#   one    (what ran, in a lease with little device time left) the tests, then the A/B on both
#          shapes, without llama.cpp or profiles;
#   collect packs /tmp/fr into $OUT/fr.tgz and prints the summary.
# From the checkout root, with bundle-h/{bench-decode,hipdecode,xtask,tests} and
# bundle-g/{bench-decode,hipdecode} carried over the calls.
set -u
D=${FR_DIR:-/tmp/fr}  # FR_DIR=$OUT/fr: logs come back even from a call cut short
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/fr.tgz" -C /tmp fr 2>/dev/null
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
case "${1:-}" in
setup)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
        >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    cp -r bundle-h/. $N/
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done; $N/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q \
        >$D/synth-q.log 2>&1; echo done >$D/synth-q.done" </dev/null >/dev/null 2>&1 &)
    st started
    run rocm-kernels gpu_selftest --nocapture
    run rocm-kernels gpu_attention
    run rocm-kernels gpu_basic
    for t in ${TESTS:-gpu_long_context gpu_backend backend_conformance step_batch batched_runs golden_tokens}; do
        case $t in
        golden_tokens) run decode golden_tokens gpu ;;
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    ;;
bench)
    # Both builds group the MoE prefill on the device (the parent's default was host), so the
    # 30B-A3B rows compare the attention kernels alone.
    export HIPDECODE_GPU_MOE_INDEX=device
    cp bundle-h/bench-decode bundle-h/hipdecode $N/ 2>/dev/null
    mkdir -p /tmp/bg && cp bundle-g/bench-decode bundle-g/hipdecode /tmp/bg/ 2>/dev/null
    wait_for $D/synth.done 300 || st "8B shape not written"
    bd() { # label binary model
        timeout 300 $2 -m $3 --device gpu -p 512,4096 -n 0 -r 3 >$D/$1.md 2>&1
        st "$1 exit $?"
    }
    for m in $L $Q; do
        [ $m = $Q ] && { wait_for $D/synth-q.done 400 || st "30B-A3B shape not written"; }
        b=$(basename $m .gguf)
        bd $b-new-1 $N/bench-decode $m
        bd $b-old-1 /tmp/bg/bench-decode $m
        bd $b-old-2 /tmp/bg/bench-decode $m
        bd $b-new-2 $N/bench-decode $m
    done
    for b in new old; do
        bin=$N/hipdecode
        [ $b = old ] && bin=/tmp/bg/hipdecode
        timeout 200 $bin profile -m $L -p 4096 --prefill >$D/profile-8b-pp4096-$b.md 2>&1
        st "profile $b exit $?"
    done
    wait_for /tmp/llama/BUILD_RC 240
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    for m in $L $Q; do
        b=$(basename $m .gguf)
        timeout 300 $LB/llama-bench -m $m -p 512,4096 -n 0 -ngl 99 -fa 1 -r 3 >$D/$b-llama.md 2>&1
        st "$b llama-bench exit $?"
    done
    ;;
one)
    # All of it in one call, for a lease with little device time left: no llama.cpp (its
    # figures come from the day's earlier lease), no profiles; the tests, then the 8B shape's
    # A/B, then the 30B-A3B shape's if it is written by then.
    export HIPDECODE_GPU_MOE_INDEX=device
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    cp -r ${BUNDLE:-bundle-h}/. $N/
    mkdir -p /tmp/bg && cp bundle-g/bench-decode /tmp/bg/
    (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done; $N/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q \
        >$D/synth-q.log 2>&1; echo done >$D/synth-q.done" </dev/null >/dev/null 2>&1 &)
    st "one started"
    # The flash kernel's own tests first, then the 8B shape's A/B, then the rest.
    # The self-test's attention cases alone (the whole table takes 100 s): every attention
    # kernel against the reference, flash among them in its native and SIMT builds.
    timeout 120 $N/hipdecode selftest --filter attention --no-models >$D/selftest-attention.txt 2>&1
    st "selftest --filter attention exit $?"
    run rocm-kernels gpu_attention
    ab() { # model: this build against the parent's, alternating
        local b
        b=$(basename $1 .gguf)
        for arm in new old old new; do
            bin=$N/bench-decode
            [ $arm = old ] && bin=/tmp/bg/bench-decode
            n=$(ls $D/$b-$arm-*.md 2>/dev/null | wc -l)
            timeout 120 $bin -m $1 --device gpu -p 512,4096 -n 0 -r 3 >$D/$b-$arm-$((n + 1)).md 2>&1
            st "$b $arm exit $?"
        done
    }
    wait_for $D/synth.done 120 && ab $L || st "8B shape not written"
    run decode gpu_long_context --test-threads=1
    run decode batched_runs --test-threads=1
    run rocm-kernels gpu_basic
    run decode backend_conformance --test-threads=2
    [ -f $D/synth-q.done ] && ab $Q || st "30B-A3B shape not written in time"
    ;;
*)
    echo "usage: $0 setup|bench|one|collect" >&2
    exit 2
    ;;
esac
