//! Pinned-host weight offload: which weights stay on the GPU and which stream from host memory under a byte budget.
