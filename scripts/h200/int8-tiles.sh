#!/usr/bin/env bash
# The int8 matrix-core product with packed scales and per-step tile shapes (issue 21), against
# the parent's kernel and llama.cpp. In phases, each in the foreground of one device call (a
# lease ends 30 s after its last call):
#   tests  while llama.cpp builds and the 8B and 30B-A3B shapes are synthesized in the
#          background: the kernel lab (scripts/kernel-lab, old file against new), then the GPU
#          tests this change touches (gpu_selftest, backend_conformance, golden_tokens,
#          generate_many, step_batch);
#   ab     bench-decode batched at 16 and 32 sequences, the parent's binary (old-bench-decode,
#          built at e73d1ee, whose kernel is the parent's) and this one alternating ABBA, then a
#          profile of 32 sequences;
#   peer   bench-decode and llama-batched-bench at 1, 8, 16, 32 and 64 sequences on the 8B
#          shape, alternating, nvidia-smi sampling memory;
#   moe    the same at 32 and 64 sequences on the 30B-A3B shape, old and new then llama.cpp;
#   mem    issue 24's 30B-A3B memory row: each process alone, nvidia-smi sampling its
#          used_memory every 50 ms: bench-decode -p 512 -n 128 -r 3 and llama-bench,
#          alternating.
# From the checkout root, with bundle-t/{bench-decode,old-bench-decode,xtask}, bundle-t2/hipdecode,
# bundle-t/tests and bundle-lab/old.hip (the parent's kernel file), and .peer:
#   bash scripts/h200/int8-tiles.sh tests|ab|peer|moe|mem; ... collect
# Logs under /tmp/it; collect packs them into $OUT/it.tgz and prints the summary.
set -u
D=/tmp/it
if [ "${1:-}" = collect ]; then
    tar czf "$OUT/it.tgz" -C /tmp it 2>/dev/null
    cat $D/summary.txt $D/status 2>/dev/null
    exit 0
fi
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
N=bundle-t
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
LB=/tmp/llama/b/bin
source scripts/h200/lease.sh
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
    python3 scripts/kernel-lab/q8_mma_lab.py crates/rocm-kernels/kernels --tokens 16,32,64 \
        --reps 50 --no-default --variant "old=@bundle-lab/old.hip,-DLAB_OLD_TILE" \
        --variant "new=" >$D/lab.md 2>$D/lab.err
    st "lab exit $?"
    for t in ${TESTS:-gpu_selftest backend_conformance golden_tokens generate_many step_batch}; do
        case $t in
        gpu_selftest) run rocm-kernels gpu_selftest --nocapture ;;
        backend_conformance) run decode backend_conformance --test-threads=2 ;;
        golden_tokens) run decode golden_tokens gpu ;;
        *) run decode $t --test-threads=1 ;;
        esac
    done
    ;;
ab)
    wait_for $D/synth.done 300 || st "8B shape not written"
    bench() { # arm binary
        timeout 200 $2 -m $L --device gpu --npl 16,32 --npp 128 --ntg 128 >$D/ab-$1.md 2>&1
        st "ab $1 exit $?"
    }
    bench old-1 $N/old-bench-decode
    bench new-1 $N/bench-decode
    bench new-2 $N/bench-decode
    bench old-2 $N/old-bench-decode
    timeout 60 bundle-t2/hipdecode profile -m $L -b 32 -p 128 -n 8 >$D/profile-b32.txt 2>&1
    st "profile exit $?"
    ;;
peer)
    LOGS=$D
    source scripts/h200/sampled.sh
    ours() { sampled $1 timeout 200 $N/bench-decode -m $L --device gpu --npl 1,8,16,32,64 \
        --npp 128 --ntg 128; }
    llama() { sampled $1 timeout 200 $LB/llama-batched-bench -m $L -c 20480 -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl 1,8,16,32,64 -ngl 99 -fa on; }
    wait_for /tmp/llama/BUILD_RC 300
    st "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
    ours new-1
    llama llama-1
    llama llama-2
    ours new-2
    st peer-done
    ;;
moe)
    LOGS=$D
    source scripts/h200/sampled.sh
    wait_for $D/synth-q.done 300 || st "30B-A3B shape not written"
    moe() { # name binary
        sampled $1 timeout 200 $2 -m $Q --device gpu --npl 32,64 --npp 128 --ntg 128
    }
    moe moe-old-1 $N/old-bench-decode
    moe moe-new-1 $N/bench-decode
    sampled moe-llama-1 timeout 200 $LB/llama-batched-bench -m $Q -c 20480 -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl 32,64 -ngl 99 -fa on
    moe moe-new-2 $N/bench-decode
    moe moe-old-2 $N/old-bench-decode
    st moe-done
    ;;
mem)
    wait_for $D/synth-q.done 300 || st "30B-A3B shape not written"
    peak mem-ours-1 timeout 200 $N/bench-decode -m $Q --device gpu -p 512 -n 128 -r 3
    peak mem-llama-1 timeout 200 $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    peak mem-ours-2 timeout 200 $N/bench-decode -m $Q --device gpu -p 512 -n 128 -r 3
    peak mem-llama-2 timeout 200 $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    peak mem-llama-3 timeout 200 $LB/llama-bench -m $Q -p 512 -n 128 -ngl 99 -fa 1 -r 3
    ;;
*)
    echo "usage: $0 tests|ab|peer|moe|mem|collect" >&2
    exit 2
    ;;
esac
