#!/usr/bin/env bash
# H200: decode tok/s at a few GPU budgets with nothing else running (offload-sweep.sh samples
# nvidia-smi every 0.2 s while each run lives, and that poller takes host cores from the
# hybrid split's spinning threads). POINTS "L:budget Q:budget ..." (L: the 8B shape, Q: the
# 30B-A3B shape); one bench-decode run each (-n 16, 2 repetitions after a warm-up).
# A point named twice runs twice (medians over processes).
# Output: $OUT/points/points.tsv and the runs' logs. Needs bundle/bin/bench-decode and the
# synthetic models in /tmp (made here when absent).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=$OUT/points
mkdir -p $O
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
wait
echo -e "model\tbudget_mib\ttg_tok_s" > $O/points.tsv
i=0
for spec in $POINTS; do
  m=${spec%%:*}; b=${spec#*:}; [ "$m" = L ] && m=$L || m=$Q
  i=$((i + 1)); name=$(basename $m .gguf)-$b-$i
  timeout 120 $B/bench-decode -m $m -p 0 -n 16 -r 2 --warmup 1 --device gpu \
    --gpu-budget ${b}MiB -o json > $O/$name.json 2> $O/$name.log
  tps=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round([x for x in r if x['n_gen'] > 0][0]['ts_median'], 2))" $O/$name.json 2>/dev/null || echo fail)
  echo -e "$(basename $m .gguf)\t$b\t$tps" | tee -a $O/points.tsv
done
