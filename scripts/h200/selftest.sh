#!/usr/bin/env bash
# `hipdecode selftest` on the device, twice (the first compiles the kernels, the second takes
# them from the cache: the "under a minute once compiled" figure), then the GPU test binaries
# the self-test change touched, with the GPU required.
#
# From the checkout root, with bundle-s/hipdecode and the test binaries in bundle-s/tests
# (a subset of `cargo xtask bundle --gpu-only`, stripped of debug info):
#   setsid bash scripts/h200/selftest.sh &
# Logs and a summary land in $OUT (or /tmp/logs); "all-done" ends the summary.
set -u
L=${OUT:-/tmp/logs}
mkdir -p "$L"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
# The test binaries look for the workspace, and the CLI tests for the hipdecode binary, where
# they were built.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p target/release && cp bundle-s/hipdecode target/release/hipdecode
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
for pass in 1 2; do
    t0=$(date +%s.%N)
    bundle-s/hipdecode selftest >"$L/selftest-$pass.out" 2>"$L/selftest-$pass.err"
    code=$?
    echo "selftest pass $pass exit $code $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >>"$L/summary.txt"
done
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    (cd "crates/$crate" && timeout 400 "../../bundle-s/tests/$bin"-* "$@" --test-threads=1 \
        >"$L/$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$L/$bin.log" | tail -1)" \
        >>"$L/summary.txt"
}
run rocm-kernels gpu_selftest --nocapture
run cli selftest --nocapture
# What the change moved out of these binaries, when they are in the bundle.
for t in gpu_basic gpu_quant gpu_dequant gpu_attention; do
    ls bundle-s/tests/$t-* >/dev/null 2>&1 && run rocm-kernels $t
done
ls bundle-s/tests/gpu_backend-* >/dev/null 2>&1 && run decode gpu_backend
echo all-done >>"$L/summary.txt"
