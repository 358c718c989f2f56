#!/usr/bin/env bash
# H200: where the hybrid offload's split should sit. bench-decode (tg only) under one budget
# per model, over the CPU-share settings (off = zero-copy only, auto, fixed shares) and the
# host thread count (SHARES, THREADS and POINTS override the lists); each run's tok/s and the shares `auto` settled on (bench-decode logs the
# backend's "hybrid offload" line). Output: $OUT/hybrid-probe/{probe.tsv,*.log}.
# Needs bundle/bin/bench-decode and bundle/xtask (to synthesize the models into /tmp).
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
echo -e "model\tbudget_mib\tsetting\tthreads\ttg_tok_s" > $O/probe.tsv
run() {  # model budget share threads
  local m=$1 b=$2 share=$3 threads=$4 name
  name=$(basename $m .gguf)-$b-$share-t$threads
  RAYON_NUM_THREADS=$threads HIPDECODE_OFFLOAD_CPU_SHARE=$share timeout 120 \
    $B/bench-decode -m $m -p 0 -n ${N:-16} -r 2 --warmup 1 --device gpu --gpu-budget ${b}MiB \
    -o json > $O/$name.json 2> $O/$name.log
  local tps
  tps=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round([x for x in r if x['n_gen'] > 0][0]['ts_median'], 2))" $O/$name.json 2>/dev/null || echo fail)
  echo -e "$(basename $m .gguf)\t$b\t$share\t$threads\t$tps" | tee -a $O/probe.tsv
  grep -h "hybrid offload" $O/$name.log | cut -c1-400
}
for spec in ${POINTS:-L:1003 Q:5773}; do
  m=${spec%%:*}; b=${spec#*:}; [ "$m" = L ] && m=$L || m=$Q
  for share in ${SHARES:-off auto 0.25 0.5 0.75}; do run $m $b $share 16; done
  for t in ${THREADS:-8 15}; do run $m $b auto $t; done
done
