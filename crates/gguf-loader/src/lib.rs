//! Zero-copy GGUF and safetensors model files: metadata, tensor index, quantized formats and a writer.
