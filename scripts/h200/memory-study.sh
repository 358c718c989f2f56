#!/usr/bin/env bash
# H200: the memory study (issue 12). Every byte of each phase explained for the three models at
# pp512/tg128 and at a 32k context, with memory timelines; the knob sweep on all three models;
# the capture-stream A/B (current stream against a side stream with its own pool); the graphs'
# memory, estimated against measured; the stranded-block report with graphs on a side stream;
# the tests that check the snapshot's stranded list, the BLAS workspace, the side-stream capture
# (same logits as the default) and the graph node count.
# Logs under $OUT/memory-study/, one file per step, and steps.txt with each step's exit status
# and seconds (a failing step is logged and the script goes on).
#
# Needs a bundle with a release bench-decode in bundle/bin/ (see README.md) and the real Gemma
# file at /tmp/gemma3-270m-q4_k_m.gguf; the 8B and 30B-A3B shapes are synthesized into /tmp
# when absent (as speed-prefill.sh does). Device time, estimated from the earlier H200 runs
# (loads of about 1, 4 and 12 s): about 6 minutes, plus the synthesis on a fresh machine.
set -u
set -o pipefail
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_BLAS=1
B=bundle/bin
G=models/gemma3-270m-q4_k_m.gguf
L=/tmp/llama3-8b-q4_k_m.gguf
Q=/tmp/qwen3-30b-a3b-q4_k_m.gguf
O=${OUT:?set OUT to the folder that receives the logs}/memory-study
mkdir -p "$O" models
: > "$O/steps.txt"
cp /tmp/gemma3-270m-q4_k_m.gguf models/ 2>/dev/null

# step NAME SECONDS COMMAND...: runs the command under a time limit, its output in NAME.log,
# and records the exit status and duration; never stops the script.
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$O/steps.txt"
  return 0
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv; date -u; } \
  > "$O/gpu.txt" 2>&1
[ -f $L ] || bundle/xtask synth-model llama3-8b-q4_k_m -o $L > "$O/synth-8b.log" 2>&1 &
[ -f $Q ] || bundle/xtask synth-model qwen3-30b-a3b-q4_k_m -o $Q > "$O/synth-30b.log" 2>&1 &

# The study runs in two parts so each fits one device call (10 minutes): PART=1 the tests,
# Gemma's sweep and A/Bs and the breakdowns of all three models; PART=2 the sweeps of the two
# large models. Unset runs both.
PART=${PART:-all}
if [ "$PART" != 2 ]; then
# Tests first (the models are being synthesized meanwhile). The allocator's stranded list,
# reserved-bytes partition and trim window on the simulated device; the BLAS workspace under
# the workspace tag; the graph's kernel-node count in a real capture.
T=$(ls bundle/tests/memory_study-* 2>/dev/null | head -1)
step test-memory-study 60 bash -c "cd crates/rocm-alloc && ../../$T --nocapture"
T=$(ls bundle/tests/blas_workspace-* 2>/dev/null | head -1)
step test-blas-workspace 120 bash -c \
  "cd crates/decode && HIPDECODE_REQUIRE_GPU=1 ../../$T --nocapture --test-threads=1"
T=$(ls bundle/tests/capture_stream-* 2>/dev/null | head -1)
step test-capture-stream 120 bash -c \
  "cd crates/decode && HIPDECODE_REQUIRE_GPU=1 ../../$T --nocapture --test-threads=1"
T=$(ls bundle/tests/gpu-* 2>/dev/null | head -1)
step test-graph-nodes 120 bash -c \
  "cd crates/hip-ffi && HIPDECODE_REQUIRE_GPU=1 ../../$T graph_capture_and_replay --nocapture"

# Gemma's sweep while the synthesis finishes: every knob, 2 rounds.
# (-p 0: the sweep reports decode t/s; the load's peak reserved is in every child's JSON.)
step sweep-gemma 150 $B/bench-decode -m $G -p 0 -n 64 --device gpu --sweep --rounds 2
# The capture-stream A/B on Gemma in its own ABBA run, 4 rounds (the 8B has it in its sweep;
# the 30B-A3B, whose loads are long, does not).
step ab-capture-stream-gemma 90 $B/bench-decode -m $G -p 0 -n 128 --device gpu --rounds 4 \
  --ab '' 'HIPDECODE_CAPTURE_STREAM=side'
# Graphs on a side stream with the shared pool: the report's stranded lines (if the side
# stream's pool holds any cached block) and the graph books.
step stranded-side-gemma 60 env HIPDECODE_CAPTURE_STREAM=side HIPDECODE_GRAPH_POOL=shared \
  $B/bench-decode -m $G -p 64 -n 16 -r 1 --device gpu
wait
echo "synthesized: $(ls -la $L $Q 2>&1 | tr '\n' ' ')" >> "$O/steps.txt"

# Every byte explained, with the graph memory table and the timelines: pp512/tg128, then a
# context of 32k positions (prompt 512, the KV cache sized for 32768).
step breakdown-pp512-tg128 200 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 128 -r 2 \
  --device gpu --svg "$O/timeline-pp512-tg128.svg"
step breakdown-ctx32k 200 $B/bench-decode -m $G -m $L -m $Q -p 512 -n 64 -r 1 --ctx 32768 \
  --device gpu --svg "$O/timeline-ctx32k.svg"

fi
wait
if [ "$PART" != 1 ]; then
# The sweeps of the large models, 2 rounds each: the cache bounds (for the default) on both,
# the capture stream and the graph pool on the 8B (a 30B-A3B load takes about 12 s, so its
# sweep keeps to the cache bounds).
step sweep-8b 150 $B/bench-decode -m $L -p 0 -n 64 --device gpu --sweep --rounds 2 \
  --sweep-knobs cache,capture-stream,graph-pool
step sweep-30b 200 $B/bench-decode -m $Q -p 0 -n 64 --device gpu --sweep --rounds 2 \
  --sweep-knobs cache

fi
# A summary on stdout: the step statuses, the verdicts, the chosen cache bounds, the
# unattributed shares and the graph tables.
cat "$O/steps.txt"
grep -hE "^cache limit|^verdict|^stranded|^not measured" "$O"/*.log | sort -u
for f in "$O"/breakdown-pp512-tg128.log "$O"/breakdown-ctx32k.log; do
  echo "== $f"
  grep -E "^\| (model|gemma|llama|qwen)" "$f" | grep -vE "pp512|tg128|tg64" | head -40
done
# One archive: the device tool returns only a handful of files.
tar czf "$OUT/memory-study.tgz" -C "$OUT" memory-study && rm -rf "$O"
