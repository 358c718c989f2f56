bundle/bin/hipdecode serve -m /tmp/llama3-8b-q4_k_m.gguf --device gpu --port 8092 --ctx 1024 --parallel 32 --kv-budget 4294967296 --chat-template scripts/h200/chatml.jinja
