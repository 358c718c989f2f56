#!/usr/bin/env bash
# Decode attention on key streams (issue 23, item 3): its GPU tests, then the kernel against the
# key-tile and one-warp-per-key kernels it replaces (same binary, HIPDECODE_GPU_ATTN_DECODE),
# then against llama.cpp at depth, all in one lease.
#   1. llama.cpp builds from .peer/ and the shapes are synthesized while the tests run:
#      gpu_selftest and gpu_attention (the kernels against the CPU reference and the refusals),
#      gpu_long_context, backend_conformance, gpu_backend, step_batch, generate_many, and the
#      golden GPU tokens (compared; on a difference, blessed to a fresh file for reading);
#   2. per-op profiles of decode at 16k of context, on each kernel;
#   3. --ab of the kernels, alternating: 8B shape (key tiles before), Gemma 3 270M shape
#      (one warp per key before), both at -p 0 -n 64 -d 4096,16384, at f16 and q8_0 KV, and
#      tg128 at -p 512 -n 128; batched decode at -npl 8,32;
#   4. the issue's rows against llama-bench (-fa 1 -ngl 99 -r 3), alternating, two rounds.
#
# From the checkout root, with bundle-s/{hipdecode,bench-decode,xtask} and the test binaries in
# bundle-s/tests and bundle-t/tests (release, stripped; two folders, as one call carries at most
# 64 MiB) and .peer/ (a copy of ../shared/tools/llama.cpp), from a copy outside the checkout (a
# later call rewrites the checkout under a running script):
#   cp scripts/h200/decode-streams.sh /tmp/ds.sh; setsid bash /tmp/ds.sh &
# Logs land in /tmp/ds; "all-done" ends summary.txt. Ran once, at 851f5a6: the key-tile kernel
# (the `key-tiles` arms) was removed after this run, having lost every A/B. STEPS (default "tests profile ab peer")
# picks the parts.
set -u
D=/tmp/ds
mkdir -p "$D"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
STEPS=${STEPS:-tests profile ab peer}
B=bundle-s
L8=/tmp/llama3-8b-q4_k_m.gguf
G=/tmp/gemma3-270m-q4_k_m.gguf
LB=/tmp/llama/b/bin
st() { echo "$* at $(date -u +%T)" >>"$D/summary.txt"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv >"$D/gpu.txt"
# The test binaries look for the workspace where they were built.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
if has peer && [ ! -f /tmp/llama/BUILD_RC ]; then
    (bash .peer/build-on-device.sh >"$D/llama-build.txt" 2>&1 &)
fi
[ -f $L8 ] || $B/xtask synth-model llama3-8b-q4_k_m -o $L8 >"$D/synth.log" 2>&1
[ -f $G ] || $B/xtask synth-model gemma3-270m-q4_k_m -o $G >>"$D/synth.log" 2>&1
st "shapes written"

run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    # Binaries too large for one call's carry come in bundle-t, in a second call.
    local exe
    for i in $(seq 1 60); do
        exe=$(ls "$PWD"/bundle-[st]/tests/"$bin"-* 2>/dev/null | head -1)
        [ -n "$exe" ] && break
        sleep 5
    done
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 400 "$exe" "$@" >"$D/test-$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$D/test-$bin.log" | tail -1)" \
        >>"$D/summary.txt"
}
if has tests; then
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
            timeout 300 "$PWD"/../../bundle-[st]/tests/golden_tokens-* gpu_greedy \
            >"$D/golden-bless.log" 2>&1)
        st "golden bless exit $?"
    fi
fi

# Timings wait for llama.cpp's build, which takes most of the host's cores.
wait_peer() {
    has peer || return 0
    for i in $(seq 1 120); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 5; done
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
}
wait_peer
if has profile; then
    for k in key-streams key-tiles warp-per-key; do
        HIPDECODE_GPU_ATTN_DECODE=$k timeout 200 $B/hipdecode profile -m $L8 -p 16384 -n 16 \
            >"$D/profile-8b-d16384-$k.txt" 2>&1
        st "profile 8B d16384 $k exit $?"
    done
    for k in key-streams warp-per-key; do
        HIPDECODE_GPU_ATTN_DECODE=$k timeout 200 $B/hipdecode profile -m $G -p 16384 -n 16 \
            >"$D/profile-gemma-d16384-$k.txt" 2>&1
        st "profile Gemma d16384 $k exit $?"
    done
fi

if has ab; then
    NEW=HIPDECODE_GPU_ATTN_DECODE=key-streams
    ab() { # label model arms... (the arms and rounds go to bench-decode)
        local label=$1
        shift
        timeout 500 $B/bench-decode "$@" >"$D/ab-$label.md" 2>&1
        st "ab $label exit $?"
    }
    ab 8b-depth -m $L8 --device gpu -p 0 -n 64 -d 4096,16384 \
        --ab HIPDECODE_GPU_ATTN_DECODE=key-tiles "$NEW" --rounds 3
    ab 8b-depth-q8 -m $L8 --device gpu -p 0 -n 64 -d 4096,16384 \
        --ab "-ctk q8_0 HIPDECODE_GPU_ATTN_DECODE=warp-per-key" "-ctk q8_0 $NEW" --rounds 3
    ab gemma-depth -m $G --device gpu -p 0 -n 64 -d 4096,16384 \
        --ab HIPDECODE_GPU_ATTN_DECODE=warp-per-key "$NEW" --rounds 3
    ab 8b-tg128 -m $L8 --device gpu -p 512 -n 128 \
        --ab HIPDECODE_GPU_ATTN_DECODE=key-tiles "$NEW" --rounds 3
    ab gemma-tg128 -m $G --device gpu -p 512 -n 128 \
        --ab HIPDECODE_GPU_ATTN_DECODE=warp-per-key "$NEW" --rounds 3
    ab 8b-batched -m $L8 --device gpu --npl 8,32 --npp 128 --ntg 128 \
        --ab HIPDECODE_GPU_ATTN_DECODE=key-tiles "$NEW" --rounds 2
fi

if has peer; then
    for round in 1 2; do
        for m in $L8 $G; do
            n=$(basename $m .gguf)
            timeout 300 $B/bench-decode -m $m -p 0 -n 64 -d 4096,16384 -r 5 --device gpu \
                >"$D/tg-$n-ours-$round.md" 2>&1
            st "ours $n $round exit $?"
            timeout 300 $LB/llama-bench -m $m -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3 \
                >"$D/tg-$n-llama-$round.md" 2>&1
            st "llama $n $round exit $?"
        done
    done
    timeout 300 $B/bench-decode -m $L8 -p 0 -n 64 -d 4096,16384 -r 5 --device gpu -ctk q8_0 \
        >"$D/tg-8b-q8-ours.md" 2>&1
    st "ours 8B q8_0 exit $?"
    timeout 300 $LB/llama-bench -m $L8 -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3 \
        -ctk q8_0 -ctv q8_0 >"$D/tg-8b-q8-llama.md" 2>&1
    st "llama 8B q8_0 exit $?"
fi
echo "all-done $(date -u +%T)" >>"$D/summary.txt"
