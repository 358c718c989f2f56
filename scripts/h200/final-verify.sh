#!/usr/bin/env bash
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
mkdir -p models && cp /tmp/gemma3-270m-q4_k_m.gguf models/
bundle/run.sh > $OUT/verify.log 2>&1; echo "verify-rocm exit $?"
grep -E "RESULT|FAILED|TOTAL|backend_conformance" $OUT/verify.log | tail -8
T=$(ls bundle/tests/backend_conformance-*)
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 ../../$T --nocapture --test-threads=1) > $OUT/conformance.log 2>&1; echo "conformance exit $?"
grep -E "test result|FAILED|panicked" $OUT/conformance.log
