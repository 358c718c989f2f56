#!/usr/bin/env bash
# H200: decode tok/s over a budget sweep, REPS processes per budget (the reps interleaved, so
# drift falls on every budget alike), with nothing else on the host but one nvidia-smi query
# every 2 s for the process's peak MiB (offload-sweep.sh polls at 5 Hz, which takes cores from
# the hybrid split).
#   MODEL    L (the 8B shape) or Q (the 30B-A3B shape); BUDGETS "MiB MiB ..."; REPS (3)
# Output: $OUT/medians/$MODEL.tsv (one line per process) and $MODEL.md (medians per budget),
# and the runs' logs. Needs bundle/bin/bench-decode and bundle/xtask.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
B=bundle/bin
[ "$MODEL" = L ] && m=/tmp/llama3-8b-q4_k_m.gguf || m=/tmp/qwen3-30b-a3b-q4_k_m.gguf
[ "$MODEL" = L ] && preset=llama3-8b-q4_k_m || preset=qwen3-30b-a3b-q4_k_m
O=$OUT/medians
mkdir -p $O
[ -f $m ] || bundle/xtask synth-model $preset -o $m > /dev/null 2>&1
echo -e "model\tbudget_mib\trep\ttg_tok_s\tsmi_peak_mib" > $O/$MODEL.tsv
for rep in $(seq ${REPS:-3}); do
  for b in $BUDGETS; do
    name=$MODEL-$b-$rep
    $B/bench-decode -m $m -p 0 -n 16 -r 2 --warmup 1 --device gpu --gpu-budget ${b}MiB \
      -o json > $O/$name.json 2> $O/$name.log &
    pid=$!; peak=0
    while kill -0 $pid 2> /dev/null; do
      used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
        | awk -F', ' -v p=$pid '$1 == p { print $2 }')
      [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
      sleep 2
    done
    tps=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round([x for x in r if x['n_gen'] > 0][0]['ts_median'], 2))" $O/$name.json 2>/dev/null || echo fail)
    echo -e "$preset\t$b\t$rep\t$tps\t$peak" | tee -a $O/$MODEL.tsv
  done
done
python3 - $O/$MODEL.tsv > $O/$MODEL.md <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by = {}
for r in rows:
    by.setdefault(int(r["budget_mib"]), []).append(r)
print("| budget MiB | nvidia-smi peak MiB | tg tok/s median | runs |")
print("| ---: | ---: | ---: | --- |")
last = None
for b in sorted(by):
    t = [float(r["tg_tok_s"]) for r in by[b] if r["tg_tok_s"] != "fail"]
    smi = max(int(r["smi_peak_mib"]) for r in by[b])
    med = statistics.median(t) if t else float("nan")
    dip = " (dip)" if last is not None and med < last else ""
    print(f"| {b} | {smi} | {med:.1f}{dip} | {' / '.join(f'{x:.1f}' for x in t)} |")
    last = med
PY
cat $O/$MODEL.md
