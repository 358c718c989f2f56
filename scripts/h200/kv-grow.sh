#!/usr/bin/env bash
# A server's KV pool that grows (issue 21, item 1), and the runs the last lease left (issue 24's
# 30B-A3B memory against llama.cpp, the MoE grouped A/B, the offload_run fix). In phases, each in
# the foreground of one device call (a lease ends 30 s after its last call):
#   tests  the GPU tests this change touches: rocm-alloc's real-device tests (the growable
#          region), generate_many (a shared pool on the GPU), layout and step_batch, while
#          llama.cpp builds and the 8B and 30B-A3B shapes are synthesized in the background;
#   quick  for a short lease: hip_core, generate_many's GPU tests and layout, the 8B synthesized;
#   tests2 offload_run and gpu_backend (their binaries travel in bundle-k2);
#   serve  a server on the 8B shape asked for 64 x 131072 positions (its pool sized to the
#          device), with HIPDECODE_GPU_KV_POOL=grow then whole: nvidia-smi at `ready`, then 16
#          completions of 256 tokens at once, nvidia-smi again, and the metrics;
#   mem    each process alone, nvidia-smi sampling its used_memory every 50 ms, on the 30B-A3B
#          shape: bench-decode -p 512 -n 128 -r 3 and llama-bench, alternating (ours, llama,
#          ours, llama, llama);
#   ab     bench-decode --ab of HIPDECODE_GPU_MOE_GROUPED=vendor against the default on the
#          30B-A3B shape's batched decode at 32 and 64 sequences.
# From the checkout root, with bundle-k/{bench-decode,hipdecode,xtask} and bundle-k/tests
# (release, stripped) and .peer (llama.cpp's source and build script):
#   bash scripts/h200/kv-grow.sh tests|quick|tests2|serve|mem|ab; bash scripts/h200/kv-grow.sh collect
# Logs under /tmp/kg; collect packs them into $OUT/kg.tgz and prints the summary.
set -u
D=/tmp/kg
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/kg.tgz" -C /tmp kg 2>/dev/null
    cat $D/summary.txt 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-k
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
LB=/tmp/llama/b/bin
st() { echo "$* at $(date -u +%T)" >>$D/summary.txt; }
smi() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; }
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
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    # The test binaries travel in two folders (bundle-k, bundle-k2): one call carries 64 MiB.
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 300 ../../bundle-k*/tests/"$bin"-* "$@" \
        >$D/test-$bin.log 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' $D/test-$bin.log | tail -1)"
}
serve_arm() { # pool: grow or whole
    local pool=$1 port=8095
    HIPDECODE_GPU_KV_POOL=$pool $N/hipdecode serve -m $L --device gpu --port $port \
        --parallel 64 --ctx 131072 >$D/serve-$pool.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 90); do grep -q '^ready' $D/serve-$pool.log && break; sleep 1; done
    st "serve $pool ready: $(smi | tr '\n' ' ') MiB"
    local t0 curls=()
    t0=$(date +%s%N)
    for i in $(seq 1 16); do
        curl -s localhost:$port/v1/completions -d "{\"prompt\":\"request $i of sixteen\", \
            \"max_tokens\":256,\"temperature\":0,\"ignore_eos\":true}" >$D/serve-$pool-$i.json &
        curls+=($!)
    done
    wait "${curls[@]}"
    local ms=$((($(date +%s%N) - t0) / 1000000))
    st "serve $pool after 16 x 256 tokens ($ms ms): $(smi | tr '\n' ' ') MiB"
    curl -s localhost:$port/metrics | grep -E 'kv|memory' >$D/serve-$pool.metrics
    kill $pid
    wait $pid
    st "serve $pool exit $? ($(cat $D/serve-$pool-*.json | grep -c '"text"') answers)"
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
    run rocm-alloc hip_core --test-threads=1
    run decode generate_many --test-threads=1
    run decode layout --test-threads=1
    run decode step_batch --test-threads=1
    ;;
quick)
    # A short lease: the new GPU tests alone, and the server (no llama.cpp, no 30B-A3B shape).
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done" </dev/null >/dev/null 2>&1 &)
    run rocm-alloc hip_core --test-threads=1
    run decode generate_many --test-threads=1 on_the_gpu
    run decode layout --test-threads=1 --nocapture
    ;;
tests2)
    run decode offload_run --test-threads=1
    run decode gpu_backend --test-threads=1
    ;;
serve)
    for _ in $(seq 1 120); do [ -f $D/synth.done ] && break; sleep 2; done
    serve_arm grow
    serve_arm whole
    ;;
mem)
    for _ in $(seq 1 200); do [ -f $D/synth-q.done ] && break; sleep 2; done
    for round in 1 2; do
        peak "30b-ours-$round" $N/bench-decode -m $Q --device gpu -p 512 -n 128 -r 3
        peak "30b-llama-$round" $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    done
    peak "30b-llama-3" $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    ;;
ab)
    $N/bench-decode -m $Q --device gpu --npl 32,64 --npp 128 --ntg 64 \
        --ab "HIPDECODE_GPU_MOE_GROUPED=vendor" "" --rounds 2 >$D/moe-ab.txt 2>&1
    st "moe ab exit $?"
    ;;
esac
