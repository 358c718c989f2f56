#!/usr/bin/env bash
# H200: offload under a GPU budget (issue 11). The managed-memory probe; the GPU tests of the
# mechanism (hip-ffi's pinned and managed memory, decode's offload_run: greedy identity with
# most weights in pinned host memory); an impossible budget (the refusal) and one run that
# prints its plan per tag; then bench-decode over >= 8 budgets per model for the 8B and
# 30B-A3B shapes (tg only, -n small at low budgets), with each run's peak device memory and
# nvidia-smi's peak for the process; the table and the tok/s-against-MiB chart beside
# llama.cpp's curve. Everything under $OUT/offload/ (runs/ holds one file per run).
#
# Needs a bundle (`cargo xtask bundle`; it carries the workspace's programs, hipdecode,
# bench-decode and offload-sweep-report among them: the script stops with a message if one is
# missing from bundle/bin), and the real Gemma file at
# /tmp/gemma3-270m-q4_k_m.gguf for the Gemma identity test (it skips without it). Device time:
# about 6 minutes once the synthetic models exist (making the 30B-A3B shape takes longer); the
# slowest part is loading: each run pins most of a 18 GB model's weights.
#
# Parts, so that the work fits the device tool's 10-minute calls (the synthetic models stay in
# /tmp while the machine is warm):
#   STEPS    which parts run, of: probe tests refusal dense moe ab (default: all but ab)
#   DENSE_BUDGETS, MOE_BUDGETS   the sweep's budgets in MiB (defaults: yesterday's)
#   AB_POINTS  "model-letter:budget ..." for the ab part: alternating runs of the zero-copy-only
#            arm (HIPDECODE_OFFLOAD_CPU_SHARE=off) against the default (the hybrid split)
#   TAG      the output folder's name under $OUT (default offload)
# HIPDECODE_OFFLOAD_CPU_SHARE in the environment applies to every run.
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_MODELS_DIR=$PWD/models
B=bundle/bin
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=$OUT/${TAG:-offload}
STEPS=${STEPS:-probe tests refusal dense moe}
has() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p $O/runs models
cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null
for p in hipdecode bench-decode offload-sweep-report; do
  [ -x $B/$p ] || { echo "error: $B/$p is missing; build it (cargo build --release -p bench / -p hipdecode) and copy it into $B"; exit 1; }
done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; free -m; ulimit -l; date -u; } > $O/machine.txt 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > /dev/null 2>&1 &
if has moe || has refusal || has ab; then
  [ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > /dev/null 2>&1 &
fi

# 1. Does managed memory migrate here? (rates and verdict)
if has probe; then
  timeout 60 $B/hipdecode probe-managed > $O/probe-managed.txt 2>&1; echo "probe exit $?"
  cat $O/probe-managed.txt
fi

# 2. The GPU tests of the mechanism, a GPU required (a skip would be a failure).
test_bin() { python3 -c "import json,sys; m=json.load(open('bundle/manifest.json'))
print(next(t['binary']+' '+t['crate_dir'] for t in m['tests'] if t['name']==sys.argv[1]))" "$1"; }
has tests && for t in hip-ffi/gpu decode/offload_run; do
  read -r bin dir <<< "$(test_bin $t)"
  (cd $dir && HIPDECODE_REQUIRE_GPU=1 timeout 180 $OLDPWD/bundle/$bin --nocapture --test-threads=1) \
    > $O/test-${t//\//-}.log 2>&1
  echo "$t exit $?"; grep -E "^test |test result|greedy|tokens;|managed-memory|  (device|managed)|verdict|panicked" $O/test-${t//\//-}.log | head -40
done
wait  # the synthetic models

# 3. An impossible budget is refused with the minimum; a possible one prints its plan.
has refusal && {
timeout 60 $B/hipdecode run -m $Q -p "Hello" -n 4 --temp 0 --device gpu --gpu-budget 100MiB \
  > $O/refusal.txt 2>&1; echo "impossible budget exit $? (1 expected)"; cat $O/refusal.txt
timeout 120 $B/hipdecode run -m $Q -p "Hello" -n 16 --temp 0 --device gpu --gpu-budget 5773MiB \
  > $O/run-30b-a3b-5773MiB.txt 2>&1; echo "30B-A3B at 5773 MiB exit $?"; cat $O/run-30b-a3b-5773MiB.txt
}

# 4. The sweep. The process's nvidia-smi peak is sampled while each run lives.
smi_peak() {
  local max=0 v
  while kill -0 "$1" 2>/dev/null; do
    v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
        | awk -F', *' -v p="$1" '$1==p {print $2}')
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$max" ] && max=$v
    sleep 0.2
  done
  [ "$max" -gt 0 ] && echo "$max" || echo "-"
}
T=$O/points.tsv
[ -f $T ] || echo -e "# model\tkind\tbudget_mib\tfile\tnvidia_smi_peak_mib" > $T
sweep() {  # name kind model slow_below_mib budgets...
  local name=$1 kind=$2 m=$3 slow=$4; shift 4
  for b in "$@"; do
    local n=32; [ "$b" -lt "$slow" ] && n=16
    local base=runs/$name-${b}MiB
    $B/bench-decode -m $m -p 0 -n $n -r 2 --warmup 1 --device gpu --gpu-budget ${b}MiB -o json \
      > $O/$base.json 2> $O/$base.log &
    local pid=$!
    # A watchdog; its output goes nowhere, so a sleep it leaves behind holds no pipe open.
    ( sleep 150; kill $pid ) > /dev/null 2>&1 & local watchdog=$!
    local smi; smi=$(smi_peak $pid)
    wait $pid; local rc=$?
    kill $watchdog 2>/dev/null
    local file=$base.json; [ $rc -eq 0 ] || file=$base.log
    echo -e "$name\t$kind\t$b\t$file\t$smi" >> $T
    echo "$name ${b} MiB: exit $rc, -n $n, nvidia-smi peak $smi MiB"
  done
}
# The report is rewritten after each model, so a run cut short still leaves one.
report() { $B/offload-sweep-report $T $O > $O/report.log 2>&1; echo "report exit $?"; }
if has dense; then
  sweep llama3-8b-q4_k_m dense $L 4000 ${DENSE_BUDGETS:-1003 1500 1951 2500 2961 3500 3971 4500 5113 6000}
  report
fi
if has moe; then
  sweep qwen3-30b-a3b-q4_k_m moe $Q 12000 ${MOE_BUDGETS:-1589 3000 5773 8000 9959 12000 14141 18231 20000}
  report; cat $O/offload-sweep.md
fi

# 5. Zero-copy only against the hybrid split at a few budgets, in alternating runs.
if has ab; then
  for point in ${AB_POINTS:-L:1951 Q:5773}; do
    m=${point%%:*}; b=${point#*:}; [ "$m" = L ] && m=$L || m=$Q
    name=ab-$(basename $m .gguf)-${b}MiB
    timeout 280 $B/bench-decode -m $m -p 0 -n 32 --warmup 1 --device gpu --gpu-budget ${b}MiB \
      --ab "HIPDECODE_OFFLOAD_CPU_SHARE=off" "" --rounds 2 > $O/$name.txt 2> $O/$name.log
    echo "$name exit $?"; cat $O/$name.txt
  done
fi
