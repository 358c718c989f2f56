#!/usr/bin/env bash
# H200: prefill over weights left in host memory, streamed through the prefetch slots against
# read in place by the dequantizing kernel (HIPDECODE_OFFLOAD_PREFILL=in-place), as
# bench-decode --ab arms in alternating processes; and the offload GPU tests.
#   POINTS  "L:budget_mib Q:budget_mib ..." (L: the 8B shape, Q: the 30B-A3B shape)
#   ROUNDS  rounds of each A/B (default 2); PP prompt tokens (default 512)
# Output: $OUT/prefill/{ab.tsv,*.md,*.log,offload_run.txt}. Needs bundle/bin/bench-decode,
# bundle/tests/offload_run-* and bundle/xtask (to synthesize the models).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=$OUT/prefill
mkdir -p $O
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
HIPDECODE_REQUIRE_GPU=1 HIPDECODE_REQUIRE_BLAS=1 timeout 300 bundle/tests/offload_run-* \
  --test-threads 1 --nocapture > $O/offload_run.txt 2>&1
echo "offload_run: exit $? ($(grep -c '^test .* ok$' $O/offload_run.txt) ok)"
grep -E "test result|FAILED|panicked|SKIP" $O/offload_run.txt | head -20
wait
for spec in ${POINTS:-L:1003 Q:5773}; do
  m=${spec%%:*}; b=${spec#*:}; [ "$m" = L ] && m=$L || m=$Q
  name=$(basename $m .gguf)-$b
  timeout 400 $B/bench-decode -m $m -p ${PP:-512} -n 0 -r 2 --warmup 1 --device gpu \
    --gpu-budget ${b}MiB --ab 'HIPDECODE_OFFLOAD_PREFILL=in-place' '' --rounds ${ROUNDS:-2} \
    > $O/$name.md 2> $O/$name.log
  echo "== $name (exit $?)"; grep -iE "verdict|faster|slower|pp${PP:-512}|arm" $O/$name.md | head -12
  grep -h "streamed prefetch" $O/$name.log | head -2
done
