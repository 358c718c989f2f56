//! HIP runtime API for hipdecode: bindings loaded at run time, a checked result layer and safe RAII types.
//!
//! On AMD it loads `libamdhip64` and `libhiprtc`; on NVIDIA it serves the same HIP-shaped API
//! through the CUDA driver API and NVRTC (via cudarc), which is how the project is tested.
