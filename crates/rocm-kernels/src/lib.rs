//! HIP C++ kernels compiled at run time (hiprtc or NVRTC) with a disk cache, each with a CPU reference.
