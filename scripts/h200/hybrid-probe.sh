#!/usr/bin/env bash
# H200: where the hybrid offload's split should sit and how its host half should run.
# bench-decode (tg only) under one budget per point, once per variant; a variant is a set of
# environment assignments (`-` is the defaults). Each run's tok/s, and the backend's "hybrid
# offload" line (the shares `auto` settled on, the host cores' rate). Also the host's CPU and
# `hipdecode probe-host`. Output: $OUT/hybrid-probe/{probe.tsv,host.txt,*.log}.
#   POINTS    "L:budget_mib Q:budget_mib ..." (L: the 8B shape, Q: the 30B-A3B shape)
#   VARIANTS  e.g. "- HIPDECODE_OFFLOAD_CPU_SHARE=off HIPDECODE_HOST_POOL=rayon"; several
#             assignments in one variant are joined with commas
# Needs bundle/bin/{bench-decode,hipdecode} and bundle/xtask (to synthesize the models).
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=$OUT/hybrid-probe
mkdir -p $O
{ lscpu; numactl -H 2>&1; } > $O/host.txt
[ -x $B/hipdecode ] && $B/hipdecode probe-host --bytes 512MiB | tee $O/probe-host.txt
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
wait
echo -e "model\tbudget_mib\tvariant\ttg_tok_s" > $O/probe.tsv
for spec in ${POINTS:-L:1003 Q:5773}; do
  m=${spec%%:*}; b=${spec#*:}; [ "$m" = L ] && m=$L || m=$Q
  for variant in ${VARIANTS:--}; do
    name=$(basename $m .gguf)-$b-${variant//[=,]/_}
    envs=(); [ "$variant" = - ] || IFS=, read -ra envs <<< "$variant"
    env "${envs[@]}" timeout 120 $B/bench-decode -m $m -p 0 -n ${N:-16} -r 2 --warmup 1 \
      --device gpu --gpu-budget ${b}MiB -o json > $O/$name.json 2> $O/$name.log
    tps=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round([x for x in r if x['n_gen'] > 0][0]['ts_median'], 2))" $O/$name.json 2>/dev/null || echo fail)
    echo -e "$(basename $m .gguf)\t$b\t$variant\t$tps" | tee -a $O/probe.tsv
    grep -h "hybrid offload" $O/$name.log | cut -c1-420
  done
done
