bundle/bin/hipdecode serve -m /tmp/llama3-8b-q4_k_m.gguf --device gpu --port 8092 --ctx 1024 --parallel 8 --kv-budget 1073741824 --chat-template scripts/h200/chatml.jinja
