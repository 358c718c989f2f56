#!/usr/bin/env bash
# Decode and prefill speed before and after the kernels' __launch_bounds__ (and Gemma 2's extra
# attention argument): bench-decode of db5c568 ("old"), of 657c580, which declares the bounds on
# every platform ("new"), and of the tree that keeps them off NVIDIA ("fixed"), alternating
# processes, on the synthetic Llama 3.1 8B and Gemma 3 270M shapes.
#
# Later arms isolated the cause: "nocap" makes softcap_logit the identity, "noinline" keeps the
# capped path out of line.
#
# From the checkout root, with bundle-b/{old,new,fixed,...}/bench-decode and bundle-b/xtask:
#   setsid bash scripts/h200/launch-bounds-ab.sh &
# Logs land in /tmp/ab; "all-done" ends /tmp/ab/summary.txt.
# ARMS names the folders of bundle-b to compare (default: old new fixed); ROUNDS the rounds (3).
set -u
ARMS=${ARMS:-old new fixed}
ROUNDS=${ROUNDS:-3}
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
L=/tmp/ab
mkdir -p "$L" /tmp/m
nvidia-smi --query-gpu=name,driver_version --format=csv >"$L/gpu.txt"
bundle-b/xtask synth-model llama3-8b-q4_k_m -o /tmp/m/llama8b.gguf >"$L/synth.log" 2>&1
bundle-b/xtask synth-model gemma3-270m-q4_k_m -o /tmp/m/gemma270m.gguf >>"$L/synth.log" 2>&1
for model in llama8b gemma270m; do
    # One warm-up process per arm, unrecorded: kernel compilation and the disk cache.
    for arm in $ARMS; do
        bundle-b/$arm/bench-decode -m /tmp/m/$model.gguf --device gpu -p 16 -n 16 -r 1 >/dev/null 2>&1
    done
    for round in $(seq 1 "$ROUNDS"); do
        for arm in $ARMS; do
            bundle-b/$arm/bench-decode -m /tmp/m/$model.gguf --device gpu -p 512 -n 128 -r 5 \
                >"$L/$model-$arm-$round.md" 2>&1
            echo "$model $arm round $round exit $?" >>"$L/summary.txt"
            grep -E "\| (pp512|tg128) " "$L/$model-$arm-$round.md" | sed "s/^/$model $arm $round /" \
                >>"$L/summary.txt"
        done
    done
done
echo all-done >>"$L/summary.txt"
