#!/usr/bin/env bash
# H200: the shortest run that checks the q8_0 KV cache on a GPU (issue 23, part a), for a
# session with little device time left; kv-q8.sh is the full run. Writes under /tmp/q8 and
# prints its status; start it with setsid, keep a call waiting on it (the machine is given back
# after 30 s without one), and `bash scripts/h200/kv-q8-core.sh collect` packs $OUT/q8.tgz.
# In order, each under its own timeout:
#   1. the q8_0 kernel tests (store, decode and prefill attention over the same bytes as the
#      CPU reference) and the GPU-against-CPU q8_0 test on the tiny models of every
#      architecture, with the GPU required; llama.cpp builds meanwhile from .dev/peer;
#   2. mean NLL of SmolLM2 over data/eval/gnu-gpl3-fdl13.txt through the GPU kernels at f16
#      and q8_0, once $MODELS/ready exists, and its greedy text on the GPU and the CPU;
#   3. decode at depth on the 8B shape, bench-decode --ab '-ctk f16' '-ctk q8_0', then
#      llama-bench with the same -p/-n/-d at -ctk/-ctv f16 and q8_0;
#   4. one `llama-bench -o json` (the key set bench-decode's JSON must carry).
set -o pipefail
D=/tmp/q8
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/q8.tgz" -C /tmp q8 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
MODELS=${MODELS:-/tmp/models}
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
L=/tmp/llama3-8b-q4_k_m.gguf
B=bundle/bin
LB=/tmp/llama/b/bin
T=../../bundle/tests
S=$MODELS/smollm2-135m-instruct-q4_1.gguf
note() { echo "$* at $(date -u +%T)" >> $D/status; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
note started
[ -f /tmp/llama/BUILD_RC ] || [ -d /tmp/llama ] || bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1
[ -f $L ] || { bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1; note "8B shape written"; }

(cd crates/rocm-kernels && timeout 240 $T/gpu_attention-* q8 --test-threads=1 > $D/test-gpu_attention-q8.log 2>&1)
note "gpu_attention q8 exit $?"
(cd crates/decode && timeout 240 $T/gpu_backend-* q8_0 --test-threads=1 > $D/test-gpu_backend-q8.log 2>&1)
note "gpu_backend q8_0 exit $?"

for i in $(seq 1 60); do [ -f $MODELS/ready ] && break; sleep 2; done
if [ -f $S ]; then
  for kv in f16 q8_0; do
    timeout 120 $B/hipdecode perplexity -m $S -f data/eval/gnu-gpl3-fdl13.txt --device gpu \
      -ctk $kv --json > $D/nll-smollm2-$kv.json 2> $D/nll-smollm2-$kv.log
    note "nll smollm2 $kv exit $?"
  done
  for dev in gpu cpu; do
    timeout 60 $B/hipdecode run -m $S --device $dev --temp 0 -n 48 -ctk q8_0 \
      -p "The three primary colours of light are" > $D/greedy-q8-$dev.txt 2> $D/greedy-q8-$dev.log
    note "greedy q8_0 $dev exit $?"
  done
else
  note "no $S: NLL not measured"
fi

timeout 240 $B/bench-decode -m $L --device gpu -p 0 -n 64 -d 4096,16384 -r 3 \
  --ab '-ctk f16' '-ctk q8_0' > $D/ours-depth.txt 2> $D/ours-depth.log
note "ours depth exit $?"
for i in $(seq 1 90); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 2; done
note "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null)"
for kv in f16 q8_0; do
  timeout 150 $LB/llama-bench -m $L -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 2 \
    -ctk $kv -ctv $kv -o md > $D/llama-depth-$kv.md 2> $D/llama-depth-$kv.log
  note "llama depth $kv exit $?"
done
timeout 60 $LB/llama-bench -m $L -p 64 -n 16 -d 0,512 -fa 1 -ngl 99 -r 2 -o json \
  > $D/llama-bench.json 2> $D/llama-bench-json.log
note "llama-bench json exit $?"
note done
