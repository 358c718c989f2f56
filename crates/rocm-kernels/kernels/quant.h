// Block layouts and in-register dequantization of the ggml weight formats: being written.
#pragma once
