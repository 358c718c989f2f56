#!/usr/bin/env bash
# H200: hipdecode serve against llama-server (issue 22, item 8, "Speed against llama-server").
# Runs in the background (setsid) and writes under /tmp/serve, so a later call collects it:
#   1. the 8B shape is written to $M if it is missing (bundle/xtask synth-model, in the
#      background; this waits for it), and llama.cpp's build is waited for;
#   2. for each N in $NS (1 8 32), $ROUNDS rounds (2), hipdecode first in odd rounds and
#      llama-server first in even ones: start the server with N slots, wait for GET /health to
#      answer 200 (at most 300 s), run serve_load.py (one warm-up request, then N concurrent
#      streaming chat requests of $MAXTOK tokens with ignore_eos), stop the server (SIGTERM,
#      then SIGKILL after 60 s), with nvidia-smi sampling the device's used memory every
#      100 ms from before the start to after the exit (the peak, weights and KV included);
#   3. table.md: per N, each server's aggregate tok/s, TTFT p50 and max, median per-stream
#      tok/s and peak MiB (medians over the rounds that passed), and hipdecode's aggregate over
#      llama-server's.
# Needs: the bundle in bundle/ with the server at bundle/bin/hipdecode, llama.cpp built at
# /tmp/llama/b/bin (llama-server), python3. Launch:
#   setsid bash scripts/h200/serve-check.sh > /tmp/serve.out 2>&1 < /dev/null &
# and later `bash scripts/h200/serve-check.sh collect`, which packs /tmp/serve into
# $OUT/serve.tgz and prints the status and the table.
set -o pipefail
S=/tmp/serve
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/serve.tgz" -C /tmp serve 2>/dev/null
  cat $S/status 2>/dev/null; cat $S/table.md 2>/dev/null
  exit 0
fi
mkdir -p $S
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
M=${M:-/tmp/llama3-8b-q4_k_m.gguf}
LB=${LB:-/tmp/llama/b/bin}
NS=${NS:-"1 8 32"}
ROUNDS=${ROUNDS:-2}
MAXTOK=${MAXTOK:-128}
MODEL_NAME=${MODEL_NAME:-llama3-8b-q4_k_m}
LOAD=scripts/h200/serve_load.py
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; date -u; } > $S/gpu.txt 2>&1
echo "started $(date -u +%T): NS='$NS' ROUNDS=$ROUNDS MAXTOK=$MAXTOK model $M" > $S/status

# The 8B shape, unless it is there; an earlier call may be writing it (log /tmp/synth-l.log).
synth=
if [ ! -s $M ] && [ ! -f /tmp/synth-l.log ]; then
  bundle/xtask synth-model llama3-8b-q4_k_m -o $M > /tmp/synth-l.log 2>&1 &
  synth=$!
  echo "writing $M (pid $synth) at $(date -u +%T)" >> $S/status
fi
if [ -f /tmp/synth-l.log ]; then
  # At most 15 minutes, less when the writer is this script's and it has ended.
  for i in $(seq 1 180); do
    grep -q wrote /tmp/synth-l.log && break
    [ -n "$synth" ] && ! kill -0 $synth 2>/dev/null && break
    sleep 5
  done
  cp /tmp/synth-l.log $S/synth.log
fi
if [ ! -s $M ] || { [ -f /tmp/synth-l.log ] && ! grep -q wrote /tmp/synth-l.log; }; then
  echo "no model at $M ($(tail -1 /tmp/synth-l.log 2>/dev/null)); stopping at $(date -u +%T)" >> $S/status
  exit 1
fi
echo "model ready ($(stat -c %s $M) bytes) at $(date -u +%T)" >> $S/status
# llama.cpp: built here if this checkout has the peer's build script and nobody built it.
[ -d /tmp/llama ] || [ ! -f .dev/peer/build-on-device.sh ] || bash .dev/peer/build-on-device.sh > $S/llama-build.log 2>&1
if [ -d /tmp/llama ] && [ ! -x $LB/llama-server ]; then
  for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
fi
if [ -x $LB/llama-server ]; then
  echo "llama-server: $($LB/llama-server --version 2>&1 | grep -m1 -i version)" >> $S/status
else
  echo "no llama-server at $LB; its runs will fail" >> $S/status
fi
[ -x bundle/bin/hipdecode ] || echo "no bundle/bin/hipdecode; its runs will fail" >> $S/status

# Exit 0 when GET $1 answers 200 within 2 s.
health() {
  python3 -c 'import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)' "$1" 2>/dev/null
}

# One server run: start arm $1 with $2 slots (round $3), wait for /health, load it, stop it.
one() {
  local arm=$1 n=$2 r=$3 port
  local tag=$arm-n$n-r$r
  local cmd
  if [ $arm = llama ]; then
    port=8091
    cmd=($LB/llama-server -m $M -ngl 99 -fa on -np $n -c $((n * 1024)) --chat-template chatml
         --port $port --host 127.0.0.1)
  else
    port=8092
    cmd=(bundle/bin/hipdecode serve -m $M --device gpu --port $port --ctx 1024 --parallel $n
         --kv-budget $((n * 1024 * 131072)) --chat-template scripts/h200/chatml.jinja)
  fi
  local url=http://127.0.0.1:$port
  if health $url/health; then
    echo "$tag: something already answers on port $port; skipped at $(date -u +%T)" >> $S/status
    return
  fi
  echo "${cmd[*]}" > $S/$tag.cmd
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $S/$tag.smi 2>&1 &
  local smi=$!
  sleep 0.5
  local t0=$SECONDS
  "${cmd[@]}" > $S/$tag.log 2>&1 &
  local pid=$!
  local up=0
  while [ $((SECONDS - t0)) -lt 300 ]; do
    if health $url/health; then up=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  local rc=-
  if [ $up = 1 ]; then
    echo "$tag: healthy after $((SECONDS - t0)) s at $(date -u +%T)" >> $S/status
    timeout 600 python3 $LOAD --url $url -n $n --max-tokens $MAXTOK --rounds 1 --model $MODEL_NAME \
      --label $arm --json-out $S/$tag.json > $S/$tag.row 2> $S/$tag.load
    rc=$?
    echo "$tag: load exit $rc: $(cat $S/$tag.row)" >> $S/status
    cat $S/$tag.row >> $S/rows.md
  elif kill -0 $pid 2>/dev/null; then
    echo "$tag: no 200 from /health in 300 s at $(date -u +%T)" >> $S/status
  else
    echo "$tag: the server exited before /health answered at $(date -u +%T)" >> $S/status
  fi
  kill -TERM $pid 2>/dev/null
  local t1=$SECONDS
  while kill -0 $pid 2>/dev/null && [ $((SECONDS - t1)) -lt 60 ]; do sleep 0.5; done
  kill -0 $pid 2>/dev/null && { kill -KILL $pid; echo "$tag: SIGKILL after 60 s" >> $S/status; }
  wait $pid
  local src=$?
  sleep 0.5
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  grep -E '^[0-9]+$' $S/$tag.smi | sort -n | tail -1 > $S/$tag.peak
  echo "$tag: server exit $src after $((SECONDS - t1)) s of stopping, peak $(cat $S/$tag.peak) MiB" \
    "(before start $(grep -m1 -E '^[0-9]+$' $S/$tag.smi) MiB) at $(date -u +%T)" >> $S/status
}

for n in $NS; do
  for r in $(seq 1 $ROUNDS); do
    if [ $((r % 2)) = 1 ]; then arms="hipdecode llama"; else arms="llama hipdecode"; fi
    for arm in $arms; do one $arm $n $r; done
  done
done

# The table: medians over the rounds whose load run passed (every request reached MAXTOK).
python3 - "$S" "$NS" "$ROUNDS" "$MAXTOK" "$M" > $S/table.md <<'EOF'
import glob, json, os, statistics, sys
S, NS, ROUNDS, MAXTOK, M = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4], sys.argv[5]
ARMS = [("llama", "llama-server"), ("hipdecode", "hipdecode")]
def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
def f(v, scale=1.0, d=1):
    return "-" if v is None else "%.*f" % (d, v * scale)
notes, rows = [], []
for n in NS:
    cells, agg = [], {}
    for arm, name in ARMS:
        sums, peaks = [], []
        for r in range(1, ROUNDS + 1):
            tag = "%s-n%s-r%d" % (arm, n, r)
            try:
                peaks.append(int(open(os.path.join(S, tag + ".peak")).read().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
            try:
                d = json.load(open(os.path.join(S, tag + ".json")))
            except (OSError, ValueError):
                notes.append("%s: no result (see status and %s.log)" % (tag, tag))
                continue
            if not d.get("ok"):
                w = d.get("warmup") or {}
                why = "warm-up: " + "; ".join(w.get("problems") or []) if w.get("problems") else \
                    "%s of %s requests failed or came back short" % (d["summary"]["failed"], d["summary"]["requests"])
                notes.append("%s: left out, %s" % (tag, why))
                continue
            s = d["summary"]
            sums.append(s)
            if "content deltas" in s.get("tokens_from", []):
                notes.append("%s: no usage chunk; tokens counted as content deltas" % tag)
        a = med([s["aggregate_tok_s"] for s in sums])
        agg[arm] = a
        cells.append("%s | %s | %s | %s" % (f(a), f(med([s["ttft_p50_s"] for s in sums]), 1e3),
                     f(med([s["ttft_max_s"] for s in sums]), 1e3),
                     f(med([s["per_stream_tok_s_median"] for s in sums]))))
        cells.append(f(med(peaks), d=0))
    ratio = agg["hipdecode"] / agg["llama"] if agg["llama"] and agg["hipdecode"] else None
    rows.append("| %s | %s | %s | %s | %s | %s |" % (n, cells[0], cells[2], f(ratio, d=2), cells[1], cells[3]))
print("Streaming chat, %s tokens each (ignore_eos), prompts of about 100 tokens; %s; medians of %d rounds"
      % (MAXTOK, os.path.basename(M), ROUNDS))
print("(TTFT in ms; per-stream tok/s is the median request's tokens over its first token to [DONE]).\n")
print("| N | llama-server tok/s | TTFT p50 | TTFT max | per-stream tok/s "
      "| hipdecode tok/s | TTFT p50 | TTFT max | per-stream tok/s "
      "| hipdecode / llama-server | llama-server peak MiB | hipdecode peak MiB |")
print("| ---: " * 12 + "|")
print("\n".join(rows))
if notes:
    print("\n" + "\n".join("- " + x for x in notes))
EOF
echo "table written (exit $?) at $(date -u +%T)" >> $S/status
echo "done $(date -u +%T)" >> $S/status
