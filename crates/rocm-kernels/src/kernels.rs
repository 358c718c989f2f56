//! Every kernel module compiled (through the disk cache) and loaded for one device.
//!
//! The signatures below are the contract the op wrappers in `crate::ops` are written against.

use crate::cache::{CacheKey, KernelCache};
use crate::error::{KernelError, Result};
use crate::source::KernelModule;
use hip_ffi::rtc::Compiler;
use hip_ffi::{device_compile_options, Device, Function};
use std::collections::HashMap;

/// Options every module is compiled with, after the device-derived ones (architecture and
/// `-DWARP_SIZE`). Part of the cache key, as the device-derived ones are.
const EXTRA_OPTIONS: &[&str] = &[];

/// The loaded kernels of one device.
pub struct Kernels {
    device: Device,
    wave_size: u32,
    functions: HashMap<(KernelModule, &'static str), Function>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("device", &self.device.ordinal())
            .field("wave_size", &self.wave_size)
            .field("functions", &self.functions.len())
            .finish()
    }
}

impl Kernels {
    /// Compiles (or takes from `cache`) and loads every module in [`KernelModule::ALL`] for
    /// `device`, and looks up each module's entry points ([`KernelModule::entry_points`]).
    ///
    /// The cache key of a module covers its source, the device's architecture, the compiler's
    /// version and every compile option (the wave size included). A cached code object the
    /// runtime refuses to load is dropped from the cache and compiled afresh.
    pub fn load(device: &Device, cache: &KernelCache) -> Result<Kernels> {
        let wave_size = device.warp_size()?;
        let compiler = Compiler::load(device.platform())?;
        let compiler_version = compiler.version();
        let arch = match device.arch()? {
            Some(arch) => arch,
            // hiprtc then targets the device itself; key on its name instead.
            None => format!("unnamed architecture of {}", device.name()?),
        };
        let extra: Vec<String> = EXTRA_OPTIONS.iter().map(|s| s.to_string()).collect();
        let mut flags = device_compile_options(device)?;
        flags.extend(extra.iter().cloned());
        let mut functions = HashMap::new();
        for module in KernelModule::ALL {
            let source = module.source();
            let name = module.name();
            let key = CacheKey::new(&source, &arch, &compiler_version, &flags);
            let compile = || -> Result<Vec<u8>> {
                let started = std::time::Instant::now();
                let image = device.compile(&source, name, &extra)?;
                tracing::debug!(
                    "compiled kernel module {name} for {arch} in {:.2?}",
                    started.elapsed()
                );
                Ok(image)
            };
            let image = cache.get_or_compile(name, &key, compile)?;
            let loaded = match device.load_module(&image) {
                Ok(loaded) => loaded,
                Err(first) => {
                    tracing::warn!(
                        "cached kernel module {name} did not load ({first}); recompiling"
                    );
                    cache.invalidate(name, &key);
                    let image = compile()?;
                    let loaded = device.load_module(&image)?;
                    if let Err(e) = cache.store(name, &key, &image) {
                        tracing::warn!("{e}");
                    }
                    loaded
                }
            };
            for &entry in module.entry_points() {
                let function = loaded.function(entry).map_err(|e| {
                    tracing::debug!("looking up {entry} in {name}: {e}");
                    KernelError::MissingEntryPoint {
                        module: name,
                        name: entry,
                    }
                })?;
                functions.insert((module, entry), function);
            }
        }
        Ok(Kernels {
            device: *device,
            wave_size,
            functions,
        })
    }

    /// The device the kernels were loaded for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device's wave (warp) size the kernels were compiled for: 32 or 64.
    pub fn wave_size(&self) -> u32 {
        self.wave_size
    }

    /// The entry point `name` of `module`; an error naming both when it does not exist.
    pub(crate) fn function(&self, module: KernelModule, name: &'static str) -> Result<&Function> {
        self.functions
            .get(&(module, name))
            .ok_or(KernelError::MissingEntryPoint {
                module: module.name(),
                name,
            })
    }
}
