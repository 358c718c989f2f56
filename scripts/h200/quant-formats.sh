#!/usr/bin/env bash
# Issue 25 on the device: Q2_K, Q3_K, IQ4_NL and IQ4_XS through every GPU kernel test, the tiny
# MoE model stored in each against the CPU, and real SmolLM2 on the GPU against the CPU, then
# `hipdecode run` and bench-decode on it.
#
# From the checkout root, with the test binaries and programs in bundle-q/{tests,bin} (a subset
# of `cargo xtask bundle --gpu-only`) and SmolLM2 in parts under .dev/xfer (split -b, sent over
# several calls):
#   setsid bash scripts/h200/quant-formats.sh kernels &   # needs no model
#   setsid bash scripts/h200/quant-formats.sh models &    # waits for the kernels part
# Logs and a summary land in /tmp/logs; "all-done" ends the summary.
set -u
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1 HIPDECODE_MODELS_DIR=$PWD/models
# The test binaries look for the workspace where they were built.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
L=/tmp/logs
mkdir -p "$L" models
run() { # tag crate binary [filter]
    local tag=$1 crate=$2 bin=$3
    shift 3
    (cd "crates/$crate" && timeout 400 "../../bundle-q/tests/$bin"-* "$@" --test-threads=1 \
        >"$L/$tag.log" 2>&1)
    echo "$crate/$bin $* exit $? $(grep -h 'test result' "$L/$tag.log" | tail -1)" >>"$L/summary.txt"
}
case $1 in
kernels)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
    run gpu_basic rocm-kernels gpu_basic
    run gpu_quant rocm-kernels gpu_quant
    run gpu_dequant rocm-kernels gpu_dequant
    run gpu_backend_formats decode gpu_backend weights_in
    run gpu_backend_tiny decode gpu_backend tiny_
    run backend_conformance decode backend_conformance
    echo kernels-done >>"$L/summary.txt"
    ;;
models)
    until grep -q kernels-done "$L/summary.txt" 2>/dev/null; do sleep 2; done
    m=models/smollm2-135m-instruct-q4_1.gguf
    cat .dev/xfer/tmp* >"$m"
    sha256sum "$m" >>"$L/summary.txt"
    run gpu_backend_smollm2 decode gpu_backend real_smollm2
    bundle-q/bin/hipdecode run -m "$m" --device gpu --temp 0 -n 48 \
        -p "The three primary colors are" >"$L/run.log" 2>&1
    echo "hipdecode run exit $?" >>"$L/summary.txt"
    bundle-q/bin/bench-decode -m "$m" --device gpu -p 512 -n 128 -r 5 >"$L/bench.log" 2>&1
    echo "bench-decode exit $?" >>"$L/summary.txt"
    echo all-done >>"$L/summary.txt"
    ;;
esac
