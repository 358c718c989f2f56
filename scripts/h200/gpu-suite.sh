#!/usr/bin/env bash
# Every GPU test binary of the tree, with the GPU required, after changes that touch every
# kernel (launch bounds) and add GPU paths (Gemma 2's soft-capping, tiny-qwen2 and tiny-gemma2,
# the four new weight formats). With BLESS=1, golden_tokens writes the entries it adds (the new
# presets' GPU ones) to /tmp/logs/golden.json, to be reviewed and committed; without, it
# compares with the committed file.
#
# From the checkout root, with the test binaries in bundle-g/tests (a subset of
# `cargo xtask bundle --gpu-only`):
#   setsid bash scripts/h200/gpu-suite.sh &
# Logs and a summary land in /tmp/logs; "all-done" ends the summary.
set -u
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1 HIPDECODE_MODELS_DIR=$PWD/models
# The test binaries look for the workspace where they were built.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
L=/tmp/logs
mkdir -p "$L"
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    (cd "crates/$crate" && timeout 590 "../../bundle-g/tests/$bin"-* "$@" --test-threads=1 \
        >"$L/$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$L/$bin.log" | tail -1)" \
        >>"$L/summary.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
run hip-ffi gpu
run hip-ffi blas
run rocm-alloc hip_core
run rocm-kernels gpu_selftest
run rocm-kernels gpu_basic
run rocm-kernels gpu_quant
run rocm-kernels gpu_dequant
run rocm-kernels gpu_attention
run decode gpu_backend
run decode backend_conformance
if [ -n "${BLESS:-}" ]; then
    HIPDECODE_BLESS_GOLDEN=$L/golden.json run decode golden_tokens
else
    run decode golden_tokens
fi
run decode step_batch
run decode capture_stream
run decode layout
run decode generate_many
run decode offload_run
run decode gpu_long_context
run decode blas_workspace
run decode non_finite
echo all-done >>"$L/summary.txt"
