#!/usr/bin/env bash
# `hipdecode selftest` (cold, warm, then verbose), the GPU tests that the self-test, Phi-3
# LongRoPE and the Nemo preset touch, and a golden-token run that writes the GPU entries of the
# new presets, each test binary with the GPU required.
#
# From the checkout root, with bundle-s/hipdecode and the test binaries in bundle-s/tests
# (built with `cargo build --release -p hipdecode` and `cargo test --release --no-run`,
# stripped):
#   setsid bash scripts/h200/selftest-longrope.sh &
# Logs land in /tmp/logs (copy them to $OUT); "all-done" ends summary.txt.
set -u
L=/tmp/logs
mkdir -p "$L"
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
# The test binaries look for the workspace, and the CLI tests for the hipdecode binary, where
# they were built.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p target/release && cp bundle-s/hipdecode target/release/hipdecode
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$L/gpu.txt"
stamp() { python3 -c "import time; print(round(time.time() - $1, 1))"; }
for pass in cold warm; do
    t0=$(date +%s.%N)
    bundle-s/hipdecode selftest >"$L/selftest-$pass.out" 2>"$L/selftest-$pass.err"
    echo "selftest $pass exit $? $(stamp "$t0") s" >>"$L/summary.txt"
done
t0=$(date +%s.%N)
bundle-s/hipdecode selftest -v >"$L/selftest-verbose.out" 2>"$L/selftest-verbose.err"
echo "selftest -v exit $? $(stamp "$t0") s" >>"$L/summary.txt"
run() { # crate binary [args]
    local crate=$1 bin=$2
    shift 2
    local t0=$SECONDS
    (cd "crates/$crate" && timeout 500 "../../bundle-s/tests/$bin"-* "$@" --test-threads=1 \
        >"$L/$bin.log" 2>&1)
    echo "$crate/$bin exit $? $((SECONDS - t0))s $(grep -h 'test result' "$L/$bin.log" | tail -1)" \
        >>"$L/summary.txt"
}
run hip-ffi gpu
run cli selftest --nocapture
run rocm-kernels gpu_selftest
run decode gpu_backend
HIPDECODE_BLESS_GOLDEN=$L/golden-gpu.json run decode golden_tokens gpu_greedy --nocapture
echo all-done >>"$L/summary.txt"
