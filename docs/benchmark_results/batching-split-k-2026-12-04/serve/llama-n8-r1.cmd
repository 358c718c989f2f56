/tmp/llama/b/bin/llama-server -m /tmp/llama3-8b-q4_k_m.gguf -ngl 99 -fa on -np 8 -c 8192 --chat-template chatml --port 8091 --host 127.0.0.1
