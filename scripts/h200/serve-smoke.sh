#!/usr/bin/env bash
# H200: a first look at `hipdecode serve --device gpu` before the long serve-check.sh: a tiny
# synthetic Llama, /health, one chat and one completion without streaming, one streamed, the
# metrics, then SIGTERM. Everything goes to $OUT/smoke.txt (and stdout).
set -o pipefail
T=/tmp/tiny-llama.gguf
[ -f $T ] || bundle/xtask synth-model tiny-llama -o $T > /tmp/synth-tiny.log 2>&1
export HIPDECODE_KERNEL_CACHE=/tmp/kcache
bundle/bin/hipdecode serve -m $T --device gpu --port 8093 --ctx 256 --parallel 4 \
  --chat-template scripts/h200/chatml.jinja > /tmp/smoke-server.log 2>&1 &
pid=$!
{
  for i in $(seq 1 120); do curl -sf localhost:8093/health > /dev/null && break; sleep 0.5; done
  echo "== health"; curl -s localhost:8093/health; echo
  echo "== chat"; curl -s localhost:8093/v1/chat/completions \
    -d '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":16,"temperature":0}'; echo
  echo "== completion x4 at once"
  for i in 1 2 3 4; do curl -s localhost:8093/v1/completions \
    -d "{\"prompt\":\"number $i\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}" > /tmp/smoke-c$i.json & done
  wait; cat /tmp/smoke-c*.json; echo
  echo "== stream"; curl -sN localhost:8093/v1/chat/completions \
    -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
  echo "== metrics"; curl -s localhost:8093/metrics | grep -E 'kv_blocks|memory_bytes|allocator|requests_finished'
  kill -TERM $pid; wait $pid; echo "== server exit $?"
  echo "== server log"; cat /tmp/smoke-server.log
} 2>&1 | tee $OUT/smoke.txt
