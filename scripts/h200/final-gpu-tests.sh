#!/usr/bin/env bash
# The final tree's GPU tests that its later changes could touch, each with the GPU required.
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
D=$OUT/final; mkdir -p $D
run() { # crate binary [filter]
  local crate=$1 bin=$2; shift 2
  (cd crates/$crate && timeout 100 ../../bundle/tests/$bin-* "$@" --test-threads=1 > $D/$bin.log 2>&1)
  echo "$crate/$bin exit $? $(grep -h 'test result' $D/$bin.log | tail -1)" | tee -a $D/summary.txt
}
run hip-ffi gpu
run hip-ffi blas
run rocm-alloc hip_core
run rocm-kernels gpu_basic
run rocm-kernels gpu_quant
run decode gpu_backend
run decode backend_conformance
run decode step_batch
run decode capture_stream
run decode golden_tokens
run decode layout
run cli cli json_stats
