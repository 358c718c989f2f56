//! What happens when a mapped model file shrinks under a running program.
//!
//! Zero-copy loading reads tensors straight out of the mapping. If another process truncates or
//! rewrites the file meanwhile, touching a page past the new end raises SIGBUS, which by
//! default kills the process with no word about why. This module keeps the address range and
//! path of every live mapping in a fixed table and installs a SIGBUS handler once: a fault
//! inside a registered mapping prints which file changed and ends the process with status 1; any
//! other fault goes to the handler that was there before (Rust's own, or the default action).
//!
//! This is the crate's one module of raw libc calls. The handler only reads atomics and calls
//! async-signal-safe functions (`write`, `_exit`, `sigaction`).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings guarded at once; more are still mapped, only without the message.
const SLOTS: usize = 64;

struct Slot {
    /// Start of the mapping, 0 while the slot is free or being filled.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The path's bytes (a leaked `Box<[u8]>` until the slot is released) and their length.
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
    /// Claimed with a compare-exchange before any other field is written.
    taken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
    taken: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// The SIGBUS action before ours, for faults outside every registered mapping. Set before our
/// handler is installed; reading it in the handler is one atomic load.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();

type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// A registered mapping; dropping it takes the range out of the table.
#[derive(Debug)]
pub struct Guard {
    slot: Option<usize>,
}

/// Registers `bytes` (a live mapping of the file at `path`) so that a SIGBUS inside it names
/// the file. Returns a guard that must be dropped before the mapping is unmapped.
pub fn register(bytes: &[u8], path: &std::path::Path) -> Guard {
    INSTALL.call_once(install);
    let Some(index) = (0..SLOTS).find(|&i| {
        TABLE[i]
            .taken
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return Guard { slot: None };
    };
    let slot = &TABLE[index];
    let path_bytes: Box<[u8]> = path.as_os_str().as_encoded_bytes().into();
    let path_len = path_bytes.len();
    slot.path_len.store(path_len, Ordering::Relaxed);
    slot.path
        .store(Box::into_raw(path_bytes).cast::<u8>(), Ordering::Relaxed);
    slot.len.store(bytes.len(), Ordering::Relaxed);
    // Release: the handler that sees `start` sees the fields above.
    slot.start.store(bytes.as_ptr() as usize, Ordering::Release);
    Guard { slot: Some(index) }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(index) = self.slot else { return };
        let slot = &TABLE[index];
        slot.start.store(0, Ordering::Release);
        let path = slot.path.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let len = slot.path_len.load(Ordering::Relaxed);
        if !path.is_null() {
            // SAFETY: `path` came from `Box::into_raw` of a `Box<[u8]>` of `len` bytes in
            // `register`, and the swap above took it out of the slot, so it is freed once. The
            // handler reads it only for a fault inside this mapping, which nobody touches while
            // its owner is being dropped.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(path, len)) });
        }
        slot.taken.store(false, Ordering::Release);
    }
}

fn install() {
    // SAFETY: `sigaction` with a zeroed struct whose handler and flags are set below is the
    // documented way to install a handler; the previous action is stored before ours can run
    // (the `set` happens before the second `sigaction` call that installs it).
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
            return;
        }
        let _ = PREVIOUS.set(previous);
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigbus as SigInfoHandler as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for an SA_SIGINFO handler.
    let address = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let start = slot.start.load(Ordering::Acquire);
        if start == 0 || address < start || address - start >= slot.len.load(Ordering::Relaxed) {
            continue;
        }
        let path = slot.path.load(Ordering::Relaxed);
        let path_len = slot.path_len.load(Ordering::Relaxed);
        write_stderr(b"error: the model file ");
        if !path.is_null() {
            // SAFETY: a registered slot's path points to `path_len` live bytes (see `Drop`).
            write_stderr(unsafe { std::slice::from_raw_parts(path, path_len) });
        }
        write_stderr(
            b" changed while in use: it was truncated or rewritten while mapped, so its tensors \
              can no longer be read. Replace model files by writing a new file and renaming it \
              over the old one, never in place.\n",
        );
        // SAFETY: `_exit` is async-signal-safe and does not return.
        unsafe { libc::_exit(1) };
    }
    match PREVIOUS.get() {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO action's handler has this signature.
                let handler: SigInfoHandler = unsafe { std::mem::transmute(p.sa_sigaction) };
                handler(signal, info, context);
            } else {
                // SAFETY: a plain action's handler takes the signal number alone.
                let handler: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                handler(signal);
            }
        }
        _ => {
            // Not ours and no handler before: the default action, when the fault repeats on
            // return.
            // SAFETY: restoring the default disposition with `signal` is async-signal-safe.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

fn write_stderr(bytes: &[u8]) {
    // SAFETY: `write` on fd 2 with a valid buffer; a short or failed write is ignored, since
    // the process is about to exit.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}
