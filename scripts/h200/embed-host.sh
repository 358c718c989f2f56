#!/usr/bin/env bash
# The untied embedding table in pinned host memory (issue 24, item 6: device memory at or below
# llama.cpp's), and the first GPU run of the int8 kernel's grouped MoE entry on the landed tile
# (issue 23 c). In phases, each in the foreground of one device call (a lease ends 30 s after
# its last call):
#   tests  the int8 kernels' self-test cases, the conformance tests of embed (the table on the
#          host too), moe and argmax, the layout against the allocator per tag, offload under a budget
#          and the golden GPU tokens, while llama.cpp builds and the 8B and 30B-A3B shapes are
#          synthesized in the background;
#   mem    a server asked for 64 x 131072 positions of KV on the 8B shape (its pool sized to
#          the device); then each process alone, nvidia-smi sampling its used_memory every 50 ms: ours with the
#          table on the host (the default) and on the device, and llama-bench, alternating, on
#          the 8B shape (two rounds: host, device, llama.cpp, device, host, llama.cpp) and the
#          30B-A3B shape (one) (`-p 512 -n 128 -r 3`, whose tg128 and pp512 are the A/B);
#   ab     bench-decode --ab of HIPDECODE_GPU_MOE_GROUPED=vendor against the default on the
#          30B-A3B shape's batched decode at 32 and 64 sequences.
# From the checkout root, with bundle-e/{bench-decode,hipdecode,xtask} and bundle-e/tests
# (release, stripped) and .peer (llama.cpp's source and build script):
#   bash scripts/h200/embed-host.sh tests|mem|ab; bash scripts/h200/embed-host.sh collect
# Logs under /tmp/eh; collect packs them into $OUT/eh.tgz and prints the summary.
set -u
D=/tmp/eh
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/eh.tgz" -C /tmp eh 2>/dev/null
    cat $D/summary.txt 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-e
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
LB=/tmp/llama/b/bin
st() { echo "$* at $(date -u +%T)" >>$D/summary.txt; }
peak() { # label command...: the process's nvidia-smi peak, sampled every 50 ms
    local label=$1
    shift
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 50 \
        >"$D/$label.smi" 2>/dev/null &
    local sampler=$!
    "$@" >"$D/$label.out" 2>&1
    local rc=$?
    sleep 0.2
    kill $sampler
    local max
    max=$(awk -F, '{gsub(/ /, "", $2); if ($2 + 0 > m) m = $2 + 0} END {print m + 0}' \
        "$D/$label.smi")
    st "$label exit $rc nvidia-smi peak $max MiB"
}
serve_fit() { # a server asked for 64 x 131072 positions on the 8B shape, until it is ready
    $N/hipdecode serve -m $L --device gpu --port 0 --parallel 64 --ctx 131072 \
        >$D/serve-fit.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 60); do grep -q '^ready' $D/serve-fit.log && break; sleep 1; done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>$D/serve-fit.log 2>&1
    kill $pid
    wait $pid
    st "serve fit $(grep -c '^ready' $D/serve-fit.log) ready"
}
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 300 ../../$N/tests/"$bin"-* "$@" \
        >$D/test-$bin.log 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' $D/test-$bin.log | tail -1)"
}
case "${1:-}" in
tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done; $N/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q \
        >$D/synth-q.log 2>&1; echo done >$D/synth-q.done" </dev/null >/dev/null 2>&1 &)
    st started
    timeout 300 $N/hipdecode selftest --no-models --filter matmul_q8_mma >$D/selftest.log 2>&1
    st "selftest matmul_q8_mma exit $? $(tail -1 $D/selftest.log)"
    run decode backend_conformance --test-threads=2 embed moe argmax
    run decode layout --test-threads=1 --nocapture
    run decode offload_run --test-threads=1
    run decode golden_tokens gpu_greedy
    if ! grep -q "test result: ok" $D/test-golden_tokens.log; then
        (cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json \
            timeout 300 ../../$N/tests/golden_tokens-* gpu_greedy >$D/golden-bless.log 2>&1)
        st "golden bless exit $?"
    fi
    ;;
quick)
    # What a short lease allows: the 8B shape synthesized while the tests of the change run,
    # then the table on the host and on the device alternating, no peer.
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done" </dev/null >/dev/null 2>&1 &)
    st started
    run decode backend_conformance --test-threads=2 embed moe argmax
    run decode layout --test-threads=1 --nocapture
    run decode golden_tokens gpu_greedy
    for _ in $(seq 1 60); do [ -f $D/synth.done ] && break; sleep 2; done
    for i in 1 2; do
        for t in host device; do
            peak "8b-$t-$i" env HIPDECODE_GPU_EMBED_TABLE=$t timeout 100 $N/bench-decode -m $L \
                --device gpu -p 512 -n 128 -r 3
        done
    done
    ;;
more)
    # The rest of a short lease: llama.cpp builds while the kernels' self-test, the offload
    # tests and the fitted server run; then llama-bench and ours once each on the 8B shape.
    [ -d /tmp/llama/b ] || (setsid bash .peer/build-on-device.sh >$D/llama-build.log 2>&1 \
        </dev/null &)
    timeout 200 $N/hipdecode selftest --no-models --filter matmul_q8_mma >$D/selftest.log 2>&1
    st "selftest matmul_q8_mma exit $? $(tail -1 $D/selftest.log)"
    run decode offload_run --test-threads=1
    serve_fit
    ;;
mem)
    for _ in $(seq 1 150); do [ -f $D/synth-q.done ] && break; sleep 2; done
    st "shapes written"
    # A server asked for far more KV than the device holds (64 sequences of 131072 positions,
    # about 1 TiB at f16 on the 8B shape) sizes its pool to the device instead of failing.
    serve_fit
    for _ in $(seq 1 90); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    ours() { # label model table
        peak "$1" env HIPDECODE_GPU_EMBED_TABLE=$3 timeout 150 $N/bench-decode -m "$2" \
            --device gpu -p 512 -n 128 -r 3
    }
    llama() { peak "$1" timeout 150 $LB/llama-bench -m "$2" -p 512 -n 128 -ngl 99 -fa 1 -r 3; }
    ours 8b-host-1 $L host
    ours 8b-device-1 $L device
    llama 8b-llama-1 $L
    ours 8b-device-2 $L device
    ours 8b-host-2 $L host
    llama 8b-llama-2 $L
    if [ "${MEM30:-1}" = 1 ]; then
        ours 30b-host-1 $Q host
        ours 30b-device-1 $Q device
        llama 30b-llama-1 $Q
    fi
    ;;
ab)
    timeout 280 $N/bench-decode -m $Q --device gpu --npl 32,64 --npp 128 --ntg 64 \
        --ab "HIPDECODE_GPU_MOE_GROUPED=vendor" "" --rounds 2 >$D/ab-moe-batched.md 2>&1
    st "ab moe batched exit $?"
    ;;
esac
