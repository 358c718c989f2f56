#!/usr/bin/env bash
# H200: the host link's rates (hipdecode probe-link), and decode with the hybrid split off,
# streaming where the planner picks it against reading every host weight in place
# (HIPDECODE_OFFLOAD_STREAM=off), as bench-decode --ab arms in alternating processes.
#   POINTS "L:budget_mib ..." (L: the 8B shape, Q: the 30B-A3B shape); ROUNDS (2)
# Output: $OUT/stream/{probe-link.txt,*.md,*.log}. Needs bundle/bin/{bench-decode,hipdecode}
# and bundle/xtask.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_OFFLOAD_CPU_SHARE=off
B=bundle/bin
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=$OUT/stream
mkdir -p $O
$B/hipdecode probe-link --bytes 512MiB | tee $O/probe-link.txt
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1
for spec in ${POINTS:-L:1003}; do
  m=${spec%%:*}; b=${spec#*:}; [ "$m" = L ] && m=$L || m=$Q
  name=$(basename $m .gguf)-$b
  $B/hipdecode plan -m $m --gpu-budget ${b}MiB --copy-gbps "${COPY_GBPS:-55}" \
    --host-compute-gbps 0 > $O/$name-plan.txt 2>&1
  grep -E "streamed|zero-copy|offload_staging" $O/$name-plan.txt | head -6
  timeout 400 $B/bench-decode -m $m -p 0 -n 16 -r 2 --warmup 1 --device gpu \
    --gpu-budget ${b}MiB --ab 'HIPDECODE_OFFLOAD_STREAM=off' '' --rounds ${ROUNDS:-2} \
    > $O/$name.md 2> $O/$name.log
  echo "== $name (exit $?)"; grep -E "verdict|\| tg" $O/$name.md | head -6
  grep -h "streamed prefetch" $O/$name.log | head -2
done
