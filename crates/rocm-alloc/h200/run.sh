#!/usr/bin/env bash
# Runs the allocator comparison and the HIP-backend tests on a GPU host.
# Usage, from the repository root: crates/rocm-alloc/h200/run.sh BUNDLE_DIR OUT_DIR [ITERS] [RUNS]
# BUNDLE_DIR holds release builds made elsewhere: h200_compare, hip_core (test binary),
# cache_hit and churn (criterion bench binaries).
set -u
B=$1
O=$2
ITERS=${3:-200000}
RUNS=${4:-7}
H=crates/rocm-alloc/h200
mkdir -p "$O"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 "model name" /proc/cpuinfo
  nproc
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$O/device.txt" 2>&1
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
ABI=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
CXX=$(command -v g++ || command -v c++ || command -v clang++)
# The toolkit's include folder (the one with crt/host_config.h, which the pip wheel lacks).
HDR=$(find /usr/local /opt -path '*/include/crt/host_config.h' 2>/dev/null | head -1)
CUDA_INC=$(dirname "$(dirname "$HDR")")
echo "compiler $CXX; cuda headers $CUDA_INC" >>"$O/device.txt"
"$CXX" -O2 -std=c++20 -D_GLIBCXX_USE_CXX11_ABI="$ABI" -I"$T/include" -I"$CUDA_INC" \
  "$H/pytorch_alloc.cpp" -L"$T/lib" -lc10_cuda -lc10 -Wl,-rpath,"$T/lib" -o /tmp/pytorch_alloc \
  >"$O/build.log" 2>&1 || echo "C++ build failed (see build.log)"
: >"$O/results.csv"
# Alternate the two programs so that drift on the host affects both alike.
for round in 1 2; do
  "$B/h200_compare" "$ITERS" "$RUNS" | sed "s/^/round$round,/" >>"$O/results.csv" 2>&1
  [ -x /tmp/pytorch_alloc ] && /tmp/pytorch_alloc "$ITERS" "$RUNS" | sed "s/^/round$round,/" >>"$O/results.csv" 2>&1
done
sed -n 's/^round2,//p' "$O/results.csv" >/tmp/round2.csv
python3 "$H/table.py" /tmp/round2.csv >"$O/table.md"
"$B/hip_core" --test-threads=1 >"$O/hip_core.log" 2>&1; echo "hip_core exit $?" >>"$O/hip_core.log"
{
  "$B/cache_hit" --bench --warm-up-time 1 --measurement-time 3
  "$B/churn" --bench --warm-up-time 1 --measurement-time 3
} >"$O/criterion.log" 2>&1
cat "$O/table.md"
tail -3 "$O/hip_core.log"
grep -E "time:" "$O/criterion.log"
