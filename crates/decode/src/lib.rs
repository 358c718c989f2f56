//! Token generation for Llama, Qwen3, Qwen3-MoE and Gemma 3: model, KV cache, sampler and tokenizer.
