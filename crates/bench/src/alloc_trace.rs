//! `--alloc-trace FILE`: records the GPU run's allocator trace and writes it for
//! `cargo xtask replay` (docs/memory.md, "Replaying a trace on another machine's memory").
//!
//! Only the GPU backend allocates through `rocm-alloc`, so the flag needs a GPU run. The
//! backend is built here rather than through `BackendChoice::run`, so that its allocator can
//! be reached (`GpuBackend::allocator`) and tracing turned on before the model loads. The
//! backend has made a few allocations by then (the step block); the trace starts with them.

use anyhow::{anyhow, Context, Result};
use decode::device::{BackendChoice, BackendSettings, WithBackend};
use rocm_alloc::trace::TraceFile;
use std::path::Path;

/// Default `--alloc-trace-capacity`: events the trace ring keeps. A decode run on the GPU
/// backend allocates at load and hardly after, so this is ample; a fuller ring drops its
/// oldest events and the file then says it is incomplete.
pub const DEFAULT_CAPACITY: usize = 1 << 20;

/// The error for `--alloc-trace` on a run that is not on the GPU.
pub fn refuse_cpu(choice: &BackendChoice) -> Result<()> {
    match choice {
        BackendChoice::Gpu(_) => Ok(()),
        other => Err(not_on_the_gpu(other)),
    }
}

fn not_on_the_gpu(choice: &BackendChoice) -> anyhow::Error {
    anyhow!(
        "--alloc-trace records the GPU allocator's trace, but this run is on the {} backend, \
         which does not allocate through rocm-alloc; run it with --device gpu on a machine with \
         a usable GPU",
        choice.name()
    )
}

/// Runs `work` on the GPU backend of `choice` with the allocator's trace on, then writes the
/// trace to `path` (after the backend is dropped, so the file ends with every free).
pub fn run_traced<W: WithBackend>(
    choice: &BackendChoice,
    settings: BackendSettings,
    work: W,
    path: &Path,
    capacity: usize,
) -> Result<(W::Output, TraceFile)> {
    let device = match choice {
        BackendChoice::Gpu(device) => *device,
        other => return Err(not_on_the_gpu(other)),
    };
    let backend = decode::device::gpu_backend(device, &settings)?;
    let alloc = backend.allocator().clone();
    alloc.enable_trace(capacity);
    let output = work.run(backend);
    let file = alloc
        .write_trace_file(path)
        .with_context(|| format!("writing the allocator trace to {}", path.display()))?;
    Ok((output, file))
}

/// One line for stderr about the written trace.
pub fn summary(path: &Path, file: &TraceFile) -> String {
    let mut s = format!(
        "wrote the allocator trace ({} events) to {}",
        file.header.events,
        path.display()
    );
    match file.header.incompleteness() {
        None => s.push_str("; replay it with `cargo xtask replay FILE --profile gfx1151`"),
        Some(why) => {
            s.push_str("; it is INCOMPLETE and cannot be replayed: ");
            s.push_str(&why);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_refused_with_the_reason() {
        let e = refuse_cpu(&BackendChoice::Cpu).unwrap_err().to_string();
        assert!(
            e.contains("--alloc-trace") && e.contains("cpu backend"),
            "{e}"
        );
        assert!(e.contains("--device gpu"), "{e}");
    }
}
