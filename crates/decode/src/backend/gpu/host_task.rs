//! The host half of a split product as a job the GPU runtime runs on its own thread, queued on
//! a stream with [`hip_ffi::Stream::launch_host_func`] so that a captured decode graph holds
//! it as a host node: at each replay the runtime calls it once the activations have been
//! copied back, and the upload of its results waits for it. The host thread that replays the
//! graph never waits mid-step.
//!
//! Each task owns its staging (pinned, so the device's copies in and out are plain DMA) and
//! its scratch, and is reached only through the runtime's call while a step runs: the backend
//! touches a task only between steps, after the stream has been synchronized.

use super::gpu_err;
use crate::backend::host_q8::{self, HostActivations};
use crate::error::{DecodeError, Result};
use crate::quant;
use gguf_loader::GgmlType;
use hip_ffi::{Device, PinnedHostBuffer};
use rocm_kernels::ops::elementwise::GateActivation;
use rocm_kernels::ops::matvec_q8::GROUP;
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a task computes.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Job {
    /// Rows `first..first + rows` of a matrix of `cols` columns in `format` (`weights` its
    /// host bytes, all rows), into `out[..rows]`.
    Rows {
        format: GgmlType,
        weights: HostBytes,
        cols: usize,
        first: usize,
        rows: usize,
    },
    /// Slots `on_gpu..k` of one token's MoE: the weighted sum of those experts' outputs
    /// (`n_embd` values) into `out`.
    Experts {
        formats: [GgmlType; 3],
        weights: [HostBytes; 3],
        n_embd: usize,
        n_ff: usize,
        n_expert: usize,
        k: usize,
        on_gpu: usize,
        act: GateActivation,
    },
}

impl Job {
    /// Columns of the activations it reads.
    pub(super) fn cols(&self) -> usize {
        match self {
            Job::Rows { cols, .. } => *cols,
            Job::Experts { n_embd, .. } => *n_embd,
        }
    }

    /// Values it writes.
    pub(super) fn outputs(&self) -> usize {
        match self {
            Job::Rows { rows, .. } => *rows,
            Job::Experts { n_embd, .. } => *n_embd,
        }
    }

    /// Routing slots it reads (ids then weights).
    pub(super) fn slots(&self) -> usize {
        match self {
            Job::Rows { .. } => 0,
            Job::Experts { k, .. } => *k,
        }
    }
}

/// The host address and length of an offloaded weight's pinned bytes. The weight outlives
/// every task that names it: both belong to one model, and graphs are replayed only while it
/// lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct HostBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are read-only while tasks exist (weights are written once, at load).
unsafe impl Send for HostBytes {}

impl HostBytes {
    pub(super) fn new(bytes: &[u8]) -> HostBytes {
        HostBytes {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// # Safety
    /// The weight these bytes came from is still loaded (see the type's documentation).
    unsafe fn get(&self) -> &[u8] {
        // SAFETY: the caller's guarantee; pinned host memory, written once at load.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Pinned staging of one task: activation values, their scales, the routing (i32 ids then
/// f32 weights) and the outputs, at offsets inside one allocation.
pub(super) struct TaskStaging {
    buffer: PinnedHostBuffer,
    scales_at: usize,
    routing_at: usize,
    out_at: usize,
}

impl TaskStaging {
    fn new(device: &Device, job: &Job) -> Result<TaskStaging> {
        let align = |n: usize| n.div_ceil(64) * 64;
        let cols = job.cols();
        let scales_at = align(cols);
        let routing_at = scales_at + align(cols / GROUP * 4);
        let out_at = routing_at + align(job.slots() * 8);
        let bytes = out_at + job.outputs() * 4;
        let buffer = PinnedHostBuffer::alloc(device, bytes)
            .map_err(|e| gpu_err("pinning a hybrid task's staging", e))?;
        Ok(TaskStaging {
            buffer,
            scales_at,
            routing_at,
            out_at,
        })
    }

    fn base(&self) -> *mut u8 {
        self.buffer.host_ptr()
    }

    /// Where the device copies the activation values (`cols` bytes).
    pub(super) fn values_ptr(&self) -> *mut i8 {
        self.base().cast()
    }

    /// Where the device copies the scales (`cols / 32` f32).
    pub(super) fn scales_ptr(&self) -> *mut f32 {
        // SAFETY: the offset lies inside the allocation (sized for it in `new`), 64-byte aligned.
        unsafe { self.base().add(self.scales_at).cast() }
    }

    /// Where the device copies the routing: `k` i32 ids, then `k` f32 weights.
    pub(super) fn routing_ptr(&self) -> *mut i32 {
        // SAFETY: the offset lies inside the allocation (sized for it in `new`), 64-byte aligned.
        unsafe { self.base().add(self.routing_at).cast() }
    }

    /// Where the task writes its outputs (f32), which the device copies in.
    pub(super) fn out_ptr(&self) -> *mut f32 {
        // SAFETY: the offset lies inside the allocation (sized for it in `new`), 64-byte aligned.
        unsafe { self.base().add(self.out_at).cast() }
    }

    pub(super) fn bytes(&self) -> usize {
        self.buffer.len_bytes()
    }
}

/// What the task's runs did, and its scratch.
#[derive(Default)]
struct TaskState {
    acts: HostActivations,
    hidden: Vec<HostActivations>,
    runs: u64,
    cpu_time: Duration,
    cpu_bytes: u64,
    error: Option<String>,
}

/// One split product's host half.
pub(super) struct HostTask {
    pub(super) job: Job,
    pub(super) staging: TaskStaging,
    state: Mutex<TaskState>,
}

impl HostTask {
    pub(super) fn new(device: &Device, job: Job) -> Result<Box<HostTask>> {
        let staging = TaskStaging::new(device, &job)?;
        Ok(Box::new(HostTask {
            job,
            staging,
            state: Mutex::new(TaskState::default()),
        }))
    }

    /// Runs the job over what the device copied into the staging.
    ///
    /// # Safety
    /// The device's copies into the staging have completed, no one else touches the staging
    /// meanwhile, and the weights named by the job are loaded.
    unsafe fn run(&self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let TaskState {
            acts,
            hidden,
            runs,
            cpu_time,
            cpu_bytes,
            ..
        } = &mut *state;
        let t = Instant::now();
        let cols = self.job.cols();
        let s = &self.staging;
        // SAFETY: the staging holds `cols` values and `cols / 32` scales at these addresses,
        // written by the device before this call (the caller's guarantee).
        let (values, scales) = unsafe {
            (
                std::slice::from_raw_parts(s.values_ptr(), cols),
                std::slice::from_raw_parts(s.scales_ptr(), cols / GROUP),
            )
        };
        acts.set(values, scales)?;
        // SAFETY: the outputs lie in the staging; only this call writes them.
        let out = unsafe { std::slice::from_raw_parts_mut(s.out_ptr(), self.job.outputs()) };
        let bytes = match &self.job {
            Job::Rows {
                format,
                weights,
                cols,
                first,
                rows,
            } => {
                // SAFETY: the caller guarantees the weights are loaded.
                let w = unsafe { weights.get() };
                host_q8::matvec_rows(*format, w, *cols, *first..*first + *rows, acts, out)?;
                (rows * quant::row_bytes(*format, *cols).unwrap_or(0)) as u64
            }
            Job::Experts {
                formats,
                weights,
                n_embd,
                n_ff,
                n_expert,
                k,
                on_gpu,
                act,
            } => {
                // SAFETY: `k` ids then `k` weights, written by the device before this call.
                let routing = unsafe { std::slice::from_raw_parts(s.routing_ptr(), 2 * k) };
                let slots: Vec<(i32, f32)> = (*on_gpu..*k)
                    .map(|i| (routing[i], f32::from_bits(routing[k + i] as u32)))
                    .collect();
                // SAFETY: the caller guarantees the weights are loaded.
                let w = unsafe { [weights[0].get(), weights[1].get(), weights[2].get()] };
                super::hybrid::cpu_experts(
                    &slots,
                    w,
                    *formats,
                    (*n_embd, *n_ff, *n_expert),
                    *act,
                    (acts, hidden),
                    out,
                )?
            }
        };
        *runs += 1;
        *cpu_time += t.elapsed();
        *cpu_bytes += bytes;
        Ok(())
    }

    /// Runs so far, host time and bytes multiplied.
    pub(super) fn totals(&self) -> (u64, Duration, u64) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (s.runs, s.cpu_time, s.cpu_bytes)
    }

    /// The first error a run hit, once.
    pub(super) fn take_error(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .error
            .take()
    }

    fn fail(&self, message: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.error.get_or_insert(message);
    }
}

/// The function the runtime calls: `data` is a `*const HostTask`.
///
/// # Safety
/// `data` points to a live [`HostTask`] whose staging the device has filled, as
/// [`hip_ffi::Stream::launch_host_func`] requires of its caller.
pub(super) unsafe extern "C" fn run_task(data: *mut c_void) {
    // SAFETY: the caller's guarantee (the backend keeps every task boxed for as long as a
    // stream or graph may call it).
    let task = unsafe { &*(data as *const HostTask) };
    // Nothing may unwind into the runtime: a panic becomes the task's error, and the outputs
    // are zeroed so the step's numbers are wrong in a visible way, not undefined.
    // SAFETY: the caller's guarantee covers `run`'s.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { task.run() }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(panic) => panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into()),
    };
    // SAFETY: as in `run`: the outputs lie in the staging and only this call writes them.
    unsafe {
        std::ptr::write_bytes(task.staging.out_ptr(), 0, task.job.outputs());
    }
    task.fail(message);
}

/// The error of a host half that failed, as the backend reports it.
pub(super) fn task_failed(message: String) -> DecodeError {
    DecodeError::Gpu(format!(
        "the host half of a split product failed during the step: {message}; the step's \
         results are not valid (HIPDECODE_OFFLOAD_CPU_SHARE=off avoids the split)"
    ))
}
