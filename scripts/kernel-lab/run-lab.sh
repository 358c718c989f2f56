#!/usr/bin/env bash
# On the device: the int8 matrix-core lab (q8_mma_lab.py) over the tile variants, then Nsight
# Compute on the default tile's gate product at 32 tokens. Writes under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/lab}
mkdir -p "$out"
kdir=$PWD/crates/rocm-kernels/kernels
lab=scripts/kernel-lab/q8_mma_lab.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/device.txt" 2>&1
# Variants: the arguments, else the tile shapes below.
if [ $# -gt 0 ]; then
    variants=("$@")
else
    variants=(
        --variant "bt32=-DMQ_BT=32"
        --variant "bk128=-DMQ_BK=128"
        --variant "w8bk128=-DMQ_WARPS=8,-DMQ_BK=128"
        --variant "w8bt32bk128=-DMQ_WARPS=8,-DMQ_BT=32,-DMQ_BK=128"
        --variant "spl8=-DLAB_BLOCKS_PER_SM=8"
    )
fi
python3 "$lab" "$kdir" --tokens 16,32,64 --reps 50 "${variants[@]}" > "$out/lab.md" 2> "$out/lab.err"
echo "lab rc $?" >> "$out/lab.err"
if command -v ncu > /dev/null; then
    timeout 240 ncu --clock-control none -k regex:matmul_q8_mma_q4_k -c 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
        python3 "$lab" "$kdir" --tokens 32 --reps 10 --shapes q4_k > "$out/ncu-default.txt" 2>&1
fi
