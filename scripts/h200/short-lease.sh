#!/usr/bin/env bash
# A short lease's first priorities, with every log written under $OUT/fr as it comes (so a
# call cut short still returns them): the self-test's attention cases (both flash prefill
# kernels and their SIMT builds against the reference), the 8B shape's A/B of the two flash
# kernels at pp512 and pp4096, then the GPU batched runs of the tiny presets (the window rings
# the scheduler moves between slots, on both paths). $BUNDLE holds hipdecode,
# bench-decode, xtask and tests/.
set -u
D=$OUT/fr N=${BUNDLE:-bundle} L=/tmp/llama3-8b-q4_k_m.gguf
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
st() { echo "$* at $(date -u +%T)" >>$D/summary.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >$D/gpu.txt
[ -f $L ] || (setsid bash -c "$N/xtask synth-model llama3-8b-q4_k_m -o $L >$D/synth.log 2>&1; \
    touch /tmp/synth.done" </dev/null >/dev/null 2>&1 &)
st started
timeout 120 $N/hipdecode selftest --filter attention --no-models >$D/selftest-attention.txt 2>&1
st "selftest --filter attention exit $?"
for _ in $(seq 1 150); do [ -f /tmp/synth.done ] && break; sleep 1; done
timeout 240 $N/bench-decode -m $L --device gpu -p 512,4096 -n 0 -r 3 \
    --ab "HIPDECODE_GPU_ATTN_PREFILL=flash" "HIPDECODE_GPU_ATTN_PREFILL=flash-regs" \
    --rounds 2 >$D/ab-8b.md 2>&1
st "a/b 8b exit $?"
(cd crates/decode && HIPDECODE_REQUIRE_GPU=1 timeout 150 ../../$N/tests/batched_runs-* every_tiny \
    --test-threads=1 >$D/test-batched_runs.log 2>&1)
st "batched_runs every_tiny exit $? $(grep -h 'test result' $D/test-batched_runs.log)"
cat $D/summary.txt
