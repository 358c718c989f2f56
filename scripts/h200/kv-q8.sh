#!/usr/bin/env bash
# H200: the q8_0 KV cache (issue 23, part a). Writes under /tmp/kvq8; start it with setsid,
# then `bash scripts/h200/kv-q8.sh collect` packs $OUT/kvq8.tgz.
#   1. the GPU tests that run q8_0 KV (rocm-kernels' attention kernels, the decode crate's GPU
#      backend against the CPU, the per-tag layout, conformance, batched steps, long context),
#      with the GPU required, while llama.cpp is built from .dev/peer and the 8B shape is
#      synthesized;
#   2. mean NLL over data/eval/gnu-gpl3-fdl13.txt at f16 and q8_0 on the GPU, for each real
#      model in $MODELS (SmolLM2-135M-Instruct, Gemma 3 270M), run last, once $MODELS/ready
#      exists (the models travel in parts while the steps before it run);
#   3. decode at depth on the 8B shape: bench-decode -p 0 -n 64 -d 4096,16384 with
#      --ab '-ctk f16' '-ctk q8_0', and llama-bench with the same -p/-n/-d -fa 1 -ngl 99 -r 3
#      at -ctk/-ctv f16 and q8_0 after it (the A/B alternates the two arms of ours); pp4096 the
#      same way;
#   4. the device peak (nvidia-smi every 100 ms) of -p 0 -n 64 -d 32000 for both programs and
#      both types;
#   5. (with 2, once the models are there) real Gemma's GPU-vs-CPU tests, and greedy text of
#      SmolLM2 and Gemma from `hipdecode run` on the GPU and the CPU, side by side.
# Step 3 also keeps one `llama-bench -o json` (the key set bench-decode's JSON must match).
# Env: STEPS (default "1 3 4 2"), MODELS (default /tmp/models).
set -o pipefail
D=/tmp/kvq8
[ -e /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
if [ "${1:-}" = collect ]; then
  tar czf "$OUT/kvq8.tgz" -C /tmp kvq8 2>/dev/null
  cat $D/status 2>/dev/null
  exit 0
fi
STEPS=${STEPS:-1 3 4 2}
MODELS=${MODELS:-/tmp/models}
mkdir -p $D
export HIPDECODE_KERNEL_CACHE=/tmp/kcache HIPDECODE_REQUIRE_GPU=1
L=/tmp/llama3-8b-q4_k_m.gguf
B=bundle/bin
LB=/tmp/llama/b/bin
T=tests
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > $D/gpu.txt 2>&1
echo "started $(date -u +%T)" >> $D/status
[ -d /tmp/llama ] || (bash .dev/peer/build-on-device.sh > $D/llama-build.log 2>&1 &)
[ -f $L ] || (bundle/xtask synth-model llama3-8b-q4_k_m -o $L > $D/synth.log 2>&1; \
  echo "model written at $(date -u +%T)" >> $D/status) &
synth=$!
step() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

if step 1; then
  (cd crates/rocm-kernels && timeout 300 ../../bundle/$T/gpu_attention-* --test-threads=1 \
    > $D/test-gpu_attention.log 2>&1)
  echo "gpu_attention exit $? at $(date -u +%T)" >> $D/status
  for t in gpu_backend layout backend_conformance step_batch generate_many gpu_long_context; do
    (cd crates/decode && timeout 300 ../../bundle/$T/$t-* --test-threads=1 > $D/test-$t.log 2>&1)
    echo "$t exit $? at $(date -u +%T)" >> $D/status
  done
fi

wait $synth
LOGS=$D
source scripts/h200/sampled.sh
for i in $(seq 1 60); do [ -f /tmp/llama/BUILD_RC ] && break; sleep 10; done
echo "llama.cpp build rc $(cat /tmp/llama/BUILD_RC 2>/dev/null) at $(date -u +%T)" >> $D/status

if step 3; then
  llama_depth() { timeout 500 $LB/llama-bench -m $L -p 0 -n 64 -d 4096,16384 -fa 1 -ngl 99 -r 3 \
    -ctk $1 -ctv $1 -o md > $D/llama-depth-$1-$2.md 2> $D/llama-depth-$1-$2.log; }
  ours_depth() { timeout 500 $B/bench-decode -m $L --device gpu -p 0 -n 64 -d 4096,16384 -r 5 \
    --ab '-ctk f16' '-ctk q8_0' > $D/ours-depth-$1.txt 2> $D/ours-depth-$1.log; }
  ours_depth 1; echo "ours depth 1 exit $? at $(date -u +%T)" >> $D/status
  llama_depth f16 1; llama_depth q8_0 1; echo "llama depth 1 at $(date -u +%T)" >> $D/status
  timeout 300 $B/bench-decode -m $L --device gpu -p 4096 -n 0 -r 3 \
    --ab '-ctk f16' '-ctk q8_0' > $D/ours-pp4096.txt 2> $D/ours-pp4096.log
  echo "ours pp4096 exit $? at $(date -u +%T)" >> $D/status
  for kv in f16 q8_0; do
    timeout 300 $LB/llama-bench -m $L -p 4096 -n 0 -fa 1 -ngl 99 -r 3 -ctk $kv -ctv $kv -o md \
      > $D/llama-pp4096-$kv.md 2> $D/llama-pp4096-$kv.log
  done
  echo "llama pp4096 at $(date -u +%T)" >> $D/status
  timeout 120 $LB/llama-bench -m $L -p 64 -n 16 -d 0,512 -fa 1 -ngl 99 -r 2 -o json \
    > $D/llama-bench.json 2> $D/llama-bench-json.log
  echo "llama-bench json exit $? at $(date -u +%T)" >> $D/status
fi

if step 4; then
  for kv in f16 q8_0; do
    sampled ours-d32000-$kv timeout 300 $B/bench-decode -m $L --device gpu -p 0 -n 64 -d 32000 \
      -r 1 -ctk $kv
    sampled llama-d32000-$kv timeout 300 $LB/llama-bench -m $L -p 0 -n 64 -d 32000 -fa 1 \
      -ngl 99 -r 1 -ctk $kv -ctv $kv
  done
  echo "peaks at $(date -u +%T)" >> $D/status
fi
if step 2; then
  for i in $(seq 1 120); do [ -f $MODELS/ready ] && break; sleep 5; done
  for m in $MODELS/smollm2-135m-instruct-q4_1.gguf $MODELS/gemma3-270m-q4_k_m.gguf; do
    [ -f $m ] || { echo "no $m: NLL not measured" >> $D/status; continue; }
    n=$(basename $m .gguf)
    for kv in f16 q8_0; do
      timeout 300 $B/hipdecode perplexity -m $m -f data/eval/gnu-gpl3-fdl13.txt --device gpu \
        -ctk $kv --json > $D/nll-$n-$kv.json 2> $D/nll-$n-$kv.log
      echo "nll $n $kv exit $? at $(date -u +%T)" >> $D/status
    done
  done
fi

if step 2; then
  (cd crates/decode && HIPDECODE_MODELS_DIR=$MODELS HIPDECODE_REQUIRE_MODELS=1 timeout 300 \
    ../../bundle/$T/gpu_backend-* real_ --test-threads=1 > $D/test-gpu_backend-real.log 2>&1)
  echo "gpu_backend real_ exit $? at $(date -u +%T)" >> $D/status
  for m in $MODELS/smollm2-135m-instruct-q4_1.gguf $MODELS/gemma3-270m-q4_k_m.gguf; do
    [ -f $m ] || continue
    n=$(basename $m .gguf)
    for dev in gpu cpu; do
      timeout 120 $B/hipdecode run -m $m --device $dev --temp 0 -n 48 \
        -p "The three primary colours of light are" > $D/greedy-$n-$dev.txt 2> $D/greedy-$n-$dev.log
      echo "greedy $n $dev exit $? at $(date -u +%T)" >> $D/status
    done
  done
fi

echo "done at $(date -u +%T)" >> $D/status
