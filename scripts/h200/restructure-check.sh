#!/usr/bin/env bash
# H200: the checks of the decode restructure (issue 20). Runs in the background (setsid) and
# writes under /tmp/check, so a later call collects it:
#   1. the two synthetic shapes are written (CPU work, about a minute on the H200's host);
#   2. verify-rocm with the GPU and the vendor library required: every GPU test, the golden
#      tokens of every tiny preset and real Gemma on both GPU paths, and the real-shape and
#      layout tests over the two synthetic shapes among them; then the layout test alone with
#      its per-tag tables printed;
#   3. bench-decode -p 512 -n 128 -r 5 --device gpu on Gemma and both shapes, from the parent
#      commit's bench-decode ($PARENT) and this one's (bundle/bin), alternating, ROUNDS rounds
#      (ROUNDS=0 skips it);
#   4. the medians per model, test and arm, with this commit's over the parent's.
# Needs: the bundle in bundle/, the parent's bench-decode at $PARENT (default /tmp/parent),
# and real Gemma joined at /tmp/g/gemma3-270m-q4_k_m.gguf. `bash ... collect` packs the logs
# into $OUT/check.tgz.
set -o pipefail
C=/tmp/check
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/check.tgz" -C /tmp check 2>/dev/null
  cat $C/status 2>/dev/null; tail -5 $C/verify.log 2>/dev/null; cat $C/speed.md 2>/dev/null
  exit 0
fi
mkdir -p $C
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_MODELS_DIR=/tmp/g
PARENT=${PARENT:-/tmp/parent}
ROUNDS=${ROUNDS:-3}
G=/tmp/g/gemma3-270m-q4_k_m.gguf
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $C/gpu.txt 2>&1
echo "started $(date -u +%T)" > $C/status
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $C/synth-l.log 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > $C/synth-q.log 2>&1 &
wait
echo "models written at $(date -u +%T)" >> $C/status
HIPDECODE_REQUIRE_GPU=1 HIPDECODE_REQUIRE_BLAS=1 HIPDECODE_SYNTH_MODELS=$L:$Q bundle/run.sh \
  > $C/verify.log 2>&1
echo "verify-rocm exit $? at $(date -u +%T)" >> $C/status
# The layout test again with its per-tag tables printed (verify-rocm keeps passing output).
for t in bundle/tests/layout-*; do
  HIPDECODE_REQUIRE_GPU=1 HIPDECODE_SYNTH_MODELS=$L:$Q $t --nocapture --test-threads 1 \
    > $C/layout.log 2>&1
  echo "layout tables exit $? at $(date -u +%T)" >> $C/status
done
for r in $(seq 1 "$ROUNDS"); do
  for arm in parent new; do
    [ $arm = parent ] && B=$PARENT || B=bundle/bin
    timeout 300 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 5 --device gpu \
      > $C/bench-$arm-$r.md 2>&1
    echo "bench $arm round $r exit $? at $(date -u +%T)" >> $C/status
  done
done
# Medians over the rounds of each run's median t/s, per model, test and arm.
[ "$ROUNDS" -gt 0 ] && python3 - "$C" "$ROUNDS" > $C/speed.md <<'EOF'
import statistics, sys
c, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for arm in ("parent", "new"):
    for r in range(1, rounds + 1):
        for line in open(f"{c}/bench-{arm}-{r}.md"):
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(cells) == 7 and cells[4] in ("pp512", "tg128"):
                runs.setdefault((cells[0], cells[4]), {}).setdefault(arm, []).append(float(cells[6]))
print("| model | test | parent (median of rounds) | this commit | ratio |")
print("| --- | --- | ---: | ---: | ---: |")
for (model, test), arms in sorted(runs.items()):
    p, n = statistics.median(arms["parent"]), statistics.median(arms["new"])
    print(f"| {model} | {test} | {p:.2f} | {n:.2f} | {n / p:.3f} |")
EOF
echo "done at $(date -u +%T)" >> $C/status
