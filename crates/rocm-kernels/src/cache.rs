//! The disk cache of compiled code objects.
//!
//! OWNER: infra engineer (E1).
//! Key: sha256 over source text, architecture, compiler version and every compile flag. Folder:
//! `$HIPDECODE_KERNEL_CACHE` when set, else the user's cache dir (`$XDG_CACHE_HOME/hipdecode/
//! kernels` or `~/.cache/hipdecode/kernels`). A corrupt or stale entry is recompiled, never
//! loaded.

/// Where compiled kernels are kept (or nowhere: [`KernelCache::disabled`]).
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<std::path::PathBuf>,
}

impl KernelCache {
    /// A cache that compiles every time (tests of the compile path).
    pub fn disabled() -> KernelCache {
        KernelCache { dir: None }
    }

    /// The folder in use, if any.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }
}
