#!/usr/bin/env bash
# The split combine with its loads in flight (after the key-stream decode kernel, and the
# key-tile kernel's removal): the GPU tests of this build, then this build's bench-decode
# against the previous commit's (851f5a6: key streams with the combine of one thread per
# dimension), alternating processes, and per-op profiles of decode at 4k, 16k and 32k.
#   1. gpu_selftest and gpu_attention (every kernel against its CPU reference, the refusals),
#      gpu_long_context, backend_conformance, gpu_backend, step_batch, generate_many, and the
#      golden GPU tokens (compared; on a difference, blessed to a fresh file for reading);
#   2. four rounds of old/new (ABBA) of: tg128 (`-p 512 -n 128 -r 3`) on the 8B and Gemma 3
#      270M shapes, tg64 at d16384 on the 8B shape, and batched decode (`--npl 1,8,32 --npp 128
#      --ntg 128`) on the 8B shape;
#   3. `hipdecode profile -p D -n 16` on the 8B shape at D = 4096, 16384 and 32000.
#
# From the checkout root, with bundle-n/{hipdecode,bench-decode,xtask} and the test binaries in
# bundle-n/tests (this build, release, stripped) and bundle-o/bench-decode (the parent's), from
# a copy outside the checkout:
#   cp scripts/h200/decode-combine.sh /tmp/dc.sh; setsid bash /tmp/dc.sh &
# Logs land in /tmp/dc; "all-done" ends summary.txt.
set -u
D=/tmp/dc
mkdir -p "$D"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-n
O=bundle-o
L8=/tmp/llama3-8b-q4_k_m.gguf
G=/tmp/gemma3-270m-q4_k_m.gguf
st() { echo "$* at $(date -u +%T)" >>"$D/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv >"$D/gpu.txt"
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
($N/xtask synth-model llama3-8b-q4_k_m -o $L8 >"$D/synth.log" 2>&1
    $N/xtask synth-model gemma3-270m-q4_k_m -o $G >>"$D/synth.log" 2>&1
    echo done >"$D/synth.done") &

run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 400 "../../$N/tests/$bin"-* "$@" \
        >"$D/test-$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$D/test-$bin.log" | tail -1)" \
        >>"$D/summary.txt"
}
run rocm-kernels gpu_selftest --nocapture
run rocm-kernels gpu_attention --test-threads=1
run decode gpu_long_context --test-threads=1
run decode backend_conformance --test-threads=2
run decode gpu_backend --test-threads=1
run decode step_batch --test-threads=1
run decode generate_many --test-threads=1
run decode golden_tokens gpu_greedy
if ! grep -q "test result: ok" "$D/test-golden_tokens.log"; then
    (cd crates/decode && HIPDECODE_REQUIRE_GPU=1 HIPDECODE_BLESS_GOLDEN=$D/greedy_tokens.json \
        timeout 300 ../../$N/tests/golden_tokens-* gpu_greedy >"$D/golden-bless.log" 2>&1)
    st "golden bless exit $?"
fi
for i in $(seq 1 120); do [ -f "$D/synth.done" ] && break; sleep 2; done
st "shapes written"

bench() { # arm label args...
    local arm=$1 label=$2
    shift 2
    local bin=$N/bench-decode
    [ "$arm" = old ] && bin=$O/bench-decode
    timeout 300 $bin --device gpu "$@" >"$D/$label-$arm-$round.md" 2>&1
    st "$label $arm $round exit $?"
}
for round in 1 2 3 4; do
    if [ $((round % 2)) = 1 ]; then arms="old new"; else arms="new old"; fi
    for arm in $arms; do
        bench $arm tg128-8b -m $L8 -p 512 -n 128 -r 3
        bench $arm tg128-gemma -m $G -p 512 -n 128 -r 3
        bench $arm d16384-8b -m $L8 -p 0 -n 64 -d 16384 -r 3
    done
done
for round in 1 2; do
    if [ $round = 1 ]; then arms="old new"; else arms="new old"; fi
    for arm in $arms; do
        bench $arm batched-8b -m $L8 --npl 1,8,32 --npp 128 --ntg 128
    done
done
for p in 4096 16384 32000; do
    timeout 200 $N/hipdecode profile -m $L8 -p $p -n 16 >"$D/profile-8b-d$p.txt" 2>&1
    st "profile d$p exit $?"
done
echo "all-done $(date -u +%T)" >>"$D/summary.txt"
