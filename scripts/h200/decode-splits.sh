#!/usr/bin/env bash
# More decode splits for models with few KV heads (a target of 512 blocks a call, up to 256
# splits): the kernels' self-test and the long-context and golden GPU tests of this build, then
# Gemma 3 270M (one KV head) on this build's bench-decode against the parent's (e76d1b6: at most
# 64 splits), alternating processes. Short, for a lease with little device time left.
#
# From the checkout root, with bundle-q/{bench-decode,xtask} and bundle-q/tests (this build,
# release, stripped) and bundle-p/bench-decode (the parent's):
#   bash scripts/h200/decode-splits.sh     (logs in $OUT/sp, written as each step ends)
set -u
D=$OUT/sp
mkdir -p "$D"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
G=/tmp/gemma3-270m-q4_k_m.gguf
st() { echo "$* at $(date -u +%T)" >>"$D/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv >"$D/gpu.txt"
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
bundle-q/xtask synth-model gemma3-270m-q4_k_m -o $G >"$D/synth.log" 2>&1 &
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 200 ../../bundle-q/tests/"$bin"-* "$@" \
        >"$D/test-$bin.log" 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' "$D/test-$bin.log" | tail -1)"
}
run rocm-kernels gpu_selftest --nocapture
run decode gpu_long_context --test-threads=1
run decode golden_tokens gpu_greedy
wait
for round in 1 2; do
    if [ $round = 1 ]; then arms="old new"; else arms="new old"; fi
    for arm in $arms; do
        bin=bundle-q/bench-decode
        [ $arm = old ] && bin=bundle-p/bench-decode
        timeout 100 $bin -m $G --device gpu -p 0 -n 64 -d 4096,16384 -r 3 \
            >"$D/depth-$arm-$round.md" 2>&1
        st "depth $arm $round exit $?"
        timeout 60 $bin -m $G --device gpu -p 512 -n 128 -r 3 >"$D/tg128-$arm-$round.md" 2>&1
        st "tg128 $arm $round exit $?"
    done
done
echo "all-done $(date -u +%T)" >>"$D/summary.txt"
