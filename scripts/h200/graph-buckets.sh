#!/usr/bin/env bash
# Decode graphs keyed by buckets of row counts (issue 21), and the runs earlier leases left
# (generate_many's GPU token check, offload_run, issue 24's 30B-A3B memory against llama.cpp).
# In phases, each in the foreground of one device call (a lease ends 30 s after its last call):
#   tests  the GPU tests this change touches (graph_buckets, generate_many, step_batch,
#          gpu_backend), while llama.cpp builds and the 8B and 30B-A3B shapes
#          are synthesized in the background;
#   quick  for a short lease: graph_buckets, tensor_parallel (two ranks on one device),
#          generate_many and step_batch, the 8B shape synthesized;
#   tests2 gpu_backend, golden_tokens and offload_run (their binaries travel in bundle-g2);
#   serve  a server on the 8B shape with 64 slots of 1024 positions, HIPDECODE_GPU_GRAPH_ROWS=exact then buckets,
#          then buckets then exact: 64 completions at once whose lengths differ (8 + 2 i
#          tokens), so the step's rows fall from 64 to 1, twice per server (the second wave
#          replays what the first captured); per wave the wall time, and at the end the
#          engine's decode steps, rows, seconds and graphs from /metrics;
#   release a server with HIPDECODE_KV_IDLE_RELEASE=3: nvidia-smi after a wave and after 6 s
#          idle, then a second wave;
#   peer   llama-server on the same model and the same two waves (-np 64 -c 65536: 1024 a slot);
#   mem    each process alone, nvidia-smi sampling its used_memory every 50 ms, on the 30B-A3B
#          shape: bench-decode -p 512 -n 128 -r 3 and llama-bench, alternating (ours, llama,
#          ours, llama, llama).
# From the checkout root, with bundle-g/{bench-decode,hipdecode,xtask}, bundle-g/tests and
# bundle-g2/tests (release, stripped) and .peer (llama.cpp's source and build script):
#   bash scripts/h200/graph-buckets.sh tests|quick|tests2|serve|release|peer|mem; ... collect
# Logs under /tmp/gb; collect packs them into $OUT/gb.tgz and prints the summary.
set -u
D=/tmp/gb
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/gb.tgz" -C /tmp gb 2>/dev/null
    cat $D/summary.txt 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-g
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
    # The test binaries travel in two folders (bundle-g, bundle-g2): one call carries 64 MiB.
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 300 ../../bundle-g*/tests/"$bin"-* "$@" \
        >$D/test-$bin.log 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' $D/test-$bin.log | tail -1)"
}
wave() { # label port path: 64 requests at once, 8 + 2 i tokens each; prints the wall ms
    local label=$1 port=$2 path=$3 t0 curls=()
    t0=$(date +%s%N)
    for i in $(seq 0 63); do
        curl -s localhost:$port$path -H 'Content-Type: application/json' -d "{\"prompt\": \
            \"request $i of sixty-four\", \"max_tokens\": $((8 + 2 * i)), \"temperature\": 0, \
            \"ignore_eos\": true}" >$D/$label-$i.json &
        curls+=($!)
    done
    wait "${curls[@]}"
    echo $((($(date +%s%N) - t0) / 1000000))
}
serve_arm() { # label rows: exact or buckets
    local label=$1 rows=$2 port=8096
    HIPDECODE_GPU_GRAPH_ROWS=$rows $N/hipdecode serve -m $L --device gpu --port $port \
        --parallel 64 --ctx 1024 >$D/$label.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 90); do grep -q '^ready' $D/$label.log && break; sleep 1; done
    local w1 w2
    w1=$(wave $label-w1 $port /v1/completions)
    w2=$(wave $label-w2 $port /v1/completions)
    curl -s localhost:$port/metrics | grep -E 'engine_step|decode_graphs|generated' \
        >$D/$label.metrics
    st "serve $label ($rows): wave 1 $w1 ms, wave 2 $w2 ms; $(grep -E 'decode_graphs |kind="decode"' \
        $D/$label.metrics | tr '\n' ' ')"
    kill $pid
    wait $pid
    st "serve $label exit $? ($(cat $D/$label-w*.json | grep -c '"text"') answers)"
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
    run decode graph_buckets --test-threads=1 --nocapture
    run decode generate_many --test-threads=1
    run decode step_batch --test-threads=1
    run decode gpu_backend --test-threads=1
    ;;
quick)
    # A short lease: the bucket tests and the batched tests beside them; the 8B shape is
    # synthesized in the background for `serve` (no llama.cpp, no 30B-A3B shape).
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    [ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
        echo done >$D/synth.done" </dev/null >/dev/null 2>&1 &)
    run decode graph_buckets --test-threads=1 --nocapture
    run decode tensor_parallel --test-threads=1
    run decode generate_many --test-threads=1
    run decode step_batch --test-threads=1
    ;;
tests2)
    run decode gpu_backend --test-threads=1
    run decode golden_tokens --test-threads=1
    run decode offload_run --test-threads=1
    ;;
serve)
    for _ in $(seq 1 120); do [ -f $D/synth.done ] && break; sleep 2; done
    serve_arm exact-1 exact
    serve_arm buckets-1 buckets
    serve_arm buckets-2 buckets
    serve_arm exact-2 exact
    ;;
release)
    # A growing pool given back when idle: a server with HIPDECODE_KV_IDLE_RELEASE=3, one wave,
    # nvidia-smi right after it and 6 s later, and a second wave served after the release.
    for _ in $(seq 1 120); do [ -f $D/synth.done ] && break; sleep 2; done
    # --kv-budget below the sequences' whole contexts (8 GiB): only a shared pool grows.
    HIPDECODE_KV_IDLE_RELEASE=3 $N/hipdecode serve -m $L --device gpu --port 8098 --parallel 64 \
        --ctx 1024 --kv-budget 2GiB >$D/release.log 2>&1 &
    pid=$!
    for _ in $(seq 1 90); do grep -q '^ready' $D/release.log && break; sleep 1; done
    st "release: ready $(smi | tr '\n' ' ')"
    w=$(wave release-w1 8098 /v1/completions)
    st "release: after a wave ($w ms) $(smi | tr '\n' ' ') $(curl -s localhost:8098/metrics | grep 'backed' | tr '\n' ' ')"
    sleep 6
    st "release: 6 s idle $(smi | tr '\n' ' ') $(curl -s localhost:8098/metrics | grep 'backed' | tr '\n' ' ')"
    w=$(wave release-w2 8098 /v1/completions)
    st "release: a second wave ($w ms) $(smi | tr '\n' ' ') answers $(cat $D/release-w2-*.json | grep -c '"text"')"
    kill $pid
    wait $pid
    ;;
peer)
    for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    $LB/llama-server -m $L -ngl 99 -fa on -np 64 -c 65536 --port 8097 >$D/llama-server.log 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do curl -s localhost:8097/health | grep -q ok && break; sleep 1; done
    w1=$(wave llama-w1 8097 /v1/completions)
    w2=$(wave llama-w2 8097 /v1/completions)
    st "llama-server: wave 1 $w1 ms, wave 2 $w2 ms"
    kill $pid
    wait $pid
    ;;
mem)
    for _ in $(seq 1 200); do [ -f $D/synth-q.done ] && break; sleep 2; done
    for round in 1 2; do
        peak "30b-ours-$round" $N/bench-decode -m $Q --device gpu -p 512 -n 128 -r 3
        peak "30b-llama-$round" $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    done
    peak "30b-llama-3" $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    ;;
esac
