//! Every kernel module compiled (through the disk cache) and loaded for one device.
//!
//! The signatures below are the contract the op wrappers in `crate::ops` are written against.

use crate::cache::{CacheKey, KernelCache, Lookup};
use crate::error::{KernelError, Result};
use crate::mma::{MmaSetting, MmaVariant};
use crate::source::KernelModule;
use hip_ffi::rtc::Compiler;
use hip_ffi::{device_compile_options, Device, Function, PlatformKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Options every module is compiled with, after the device-derived ones (architecture and
/// `-DWARP_SIZE`): the tuning defines the knobs ask for. Part of the cache key, as the
/// device-derived ones are, so a changed knob compiles afresh instead of reusing a stale image.
fn extra_options(mma: MmaVariant) -> Result<Vec<String>> {
    let mut options = vec![mma.compile_option()];
    if let Some(depth) = crate::knobs::MATVEC_DEPTH.read()? {
        options.push(format!("-DMATVEC_Q8_DEPTH={depth}"));
    }
    Ok(options)
}

/// The loaded kernels of one device.
pub struct Kernels {
    device: Device,
    wave_size: u32,
    multiprocessors: u32,
    matvec_blocks_per_sm: Option<u32>,
    mma_variant: MmaVariant,
    functions: HashMap<(KernelModule, &'static str), LoadedEntry>,
    /// On AMD, each kernel's resources from its code object's metadata (the runtime does not
    /// report them); empty elsewhere.
    amd_resources: HashMap<String, crate::code_object::KernelResources>,
}

/// What one loaded kernel takes of the hardware ([`Kernels::resources`]): from the driver on
/// NVIDIA, from the code object's metadata on AMD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelUsage {
    /// The kernel's module.
    pub module: KernelModule,
    /// The entry point.
    pub name: &'static str,
    /// Vector registers per lane (AMD VGPRs, NVIDIA registers per thread).
    pub registers: u32,
    /// Scalar registers per wave (AMD only).
    pub scalar_registers: Option<u32>,
    /// Registers spilled (AMD: VGPR and SGPR spills together; NVIDIA does not report it, its
    /// spills show as local memory).
    pub spilled_registers: Option<u32>,
    /// Local (NVIDIA) or scratch (AMD private segment) memory per lane, bytes.
    pub local_bytes: u32,
    /// Static shared memory (LDS) per block, bytes.
    pub shared_bytes: u32,
    /// The largest block the kernel can be launched with.
    pub max_block: u32,
}

/// An entry point, and whether it has been looked up for a launch since the record was last
/// cleared (what the self-test's coverage check reads).
struct LoadedEntry {
    function: Function,
    launched: AtomicBool,
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
    ///
    /// The matrix-core kernels get the variant [`crate::mma::MMA`] asks for.
    pub fn load(device: &Device, cache: &KernelCache) -> Result<Kernels> {
        Kernels::load_with_mma(device, cache, crate::mma::MMA.read()?)
    }

    /// As [`Kernels::load`], with the matrix-core kernels' variant chosen under `mma` instead
    /// of the environment's setting (the tests compare the native build with the SIMT one).
    pub fn load_with_mma(device: &Device, cache: &KernelCache, mma: MmaSetting) -> Result<Kernels> {
        let started = std::time::Instant::now();
        let wave_size = device.warp_size()?;
        let multiprocessors = device.multiprocessor_count()?;
        let matvec_blocks_per_sm = crate::knobs::MATVEC_BLOCKS_PER_SM.read()?;
        let compiler = Compiler::load(device.platform())?;
        let compiler_version = compiler.version();
        let arch = match device.arch()? {
            Some(arch) => arch,
            // hiprtc then targets the device itself; key on its name instead.
            None => format!("unnamed architecture of {}", device.name()?),
        };
        let mma_variant = MmaVariant::choose(device.platform(), device.arch()?.as_deref(), mma);
        let extra = extra_options(mma_variant)?;
        let mut flags = device_compile_options(device)?;
        flags.extend(extra.iter().cloned());
        let compile = |module: KernelModule, source: &str| -> Result<Vec<u8>> {
            let t = std::time::Instant::now();
            let image = device.compile(source, module.name(), &extra)?;
            tracing::debug!(
                "compiled kernel module {} for {arch} in {:.2?}",
                module.name(),
                t.elapsed()
            );
            Ok(image)
        };

        // Cached code objects first; what is missing (or refused) is compiled below.
        let jobs: Vec<(KernelModule, String, CacheKey)> = KernelModule::ALL
            .into_iter()
            .map(|module| {
                let source = module.source();
                let key = CacheKey::new(&source, &arch, &compiler_version, &flags);
                (module, source, key)
            })
            .collect();
        let mut images: Vec<Option<Vec<u8>>> = jobs
            .iter()
            .map(|(module, _, key)| match cache.lookup(module.name(), key) {
                Lookup::Hit(image) => Some(image),
                Lookup::Miss => None,
                Lookup::Invalid(why) => {
                    tracing::warn!(
                        "kernel cache entry of {} is not used ({why}); recompiling",
                        module.name()
                    );
                    None
                }
            })
            .collect();
        let missing: Vec<usize> = (0..jobs.len()).filter(|&i| images[i].is_none()).collect();
        let compiled = compile_all(device, &missing, &|i| compile(jobs[i].0, &jobs[i].1))?;
        for (i, image) in missing.iter().zip(compiled) {
            let (module, _, key) = &jobs[*i];
            if let Err(e) = cache.store(module.name(), key, &image) {
                tracing::warn!("{e}");
            }
            images[*i] = Some(image);
        }

        let programmatic =
            crate::knobs::EARLY_LAUNCH.read()? && device.supports_programmatic_launch()?;
        let mut functions = HashMap::new();
        let mut amd_resources = HashMap::new();
        for (i, ((module, source, key), image)) in jobs.iter().zip(images).enumerate() {
            let (module, name) = (*module, module.name());
            let from_cache = !missing.contains(&i);
            let image = image.unwrap_or_default();
            // Read while the image is at hand: a few milliseconds of msgpack at load, where
            // keeping every image for a later read would hold megabytes for the process's life.
            if device.platform() == PlatformKind::Amd {
                match crate::code_object::read(&image) {
                    Ok(object) => amd_resources
                        .extend(object.kernels.into_iter().map(|k| (k.name.clone(), k))),
                    // Only the verbose self-test reads them: a warning, not a failed load.
                    Err(e) => tracing::warn!("kernel module {name}: {e}"),
                }
            }
            let loaded = match device.load_module(&image) {
                Ok(loaded) => loaded,
                // A cached code object the runtime refuses (one the checksum cannot catch,
                // e.g. from a driver that reports the same versions but differs): drop it
                // and compile afresh.
                Err(first) if from_cache => {
                    tracing::warn!("kernel module {name} did not load ({first}); recompiling");
                    cache.invalidate(name, key);
                    let image = compile(module, source)?;
                    let loaded = device.load_module(&image)?;
                    if let Err(e) = cache.store(name, key, &image) {
                        tracing::warn!("{e}");
                    }
                    loaded
                }
                Err(e) => return Err(e.into()),
            };
            for &entry in module.entry_points() {
                let function = loaded.function(entry).map_err(|e| {
                    tracing::debug!("looking up {entry} in {name}: {e}");
                    KernelError::MissingEntryPoint {
                        module: name,
                        name: entry,
                    }
                })?;
                let function = if programmatic {
                    // SAFETY: every kernel of every module begins with KERNEL_PROLOGUE
                    // (portability.h), which waits for the grid ahead before any memory access
                    // or early return; `source.rs`'s test checks each entry point has it.
                    unsafe { function.with_programmatic_dependency() }
                } else {
                    function
                };
                functions.insert(
                    (module, entry),
                    LoadedEntry {
                        function,
                        launched: AtomicBool::new(false),
                    },
                );
            }
        }
        tracing::debug!(
            "kernels ready in {:.2?} ({} of {} modules compiled)",
            started.elapsed(),
            missing.len(),
            jobs.len()
        );
        Ok(Kernels {
            device: *device,
            wave_size,
            multiprocessors,
            matvec_blocks_per_sm,
            mma_variant,
            functions,
            amd_resources,
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

    /// The device's multiprocessor (compute unit) count, for launch shapes that fill it.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// The cap on the int8 matrix-vector grid, in blocks per multiprocessor
    /// ([`crate::knobs::MATVEC_BLOCKS_PER_SM`]); `None` for no cap.
    pub fn matvec_blocks_per_sm(&self) -> Option<u32> {
        self.matvec_blocks_per_sm
    }

    /// The implementation of the matrix-core layer the kernels were compiled with.
    pub fn mma_variant(&self) -> MmaVariant {
        self.mma_variant
    }

    /// The entry point `name` of `module` for a launch (marked launched); an error naming both
    /// when it does not exist.
    pub(crate) fn function(&self, module: KernelModule, name: &'static str) -> Result<&Function> {
        let entry = self
            .functions
            .get(&(module, name))
            .ok_or(KernelError::MissingEntryPoint {
                module: module.name(),
                name,
            })?;
        // Relaxed: the record is read after the launching thread is done (the self-test's
        // coverage check), never used to order other memory.
        entry.launched.store(true, Ordering::Relaxed);
        Ok(&entry.function)
    }

    /// Every entry point's registers, local and shared memory, in source-list order. A kernel
    /// whose figures the platform does not give (an AMD code object that could not be read) is
    /// left out.
    pub fn resources(&self) -> Result<Vec<KernelUsage>> {
        let mut usage = Vec::new();
        for module in KernelModule::ALL {
            for &name in module.entry_points() {
                let Some(entry) = self.functions.get(&(module, name)) else {
                    continue;
                };
                if let Some(r) = entry.function.resources()? {
                    usage.push(KernelUsage {
                        module,
                        name,
                        registers: r.registers,
                        scalar_registers: None,
                        spilled_registers: None,
                        local_bytes: r.local_bytes,
                        shared_bytes: r.static_shared_bytes,
                        max_block: r.max_threads_per_block,
                    });
                } else if let Some(r) = self.amd_resources.get(name) {
                    usage.push(KernelUsage {
                        module,
                        name,
                        registers: r.vgpr_count,
                        scalar_registers: Some(r.sgpr_count),
                        spilled_registers: Some(r.vgpr_spill_count + r.sgpr_spill_count),
                        local_bytes: r.private_segment_fixed_size,
                        shared_bytes: r.group_segment_fixed_size,
                        max_block: r.max_flat_workgroup_size,
                    });
                }
            }
        }
        Ok(usage)
    }

    /// Forgets which entry points were launched.
    pub fn clear_launch_record(&self) {
        for entry in self.functions.values() {
            entry.launched.store(false, Ordering::Relaxed);
        }
    }

    /// The entry points of [`KernelModule::ALL`] not launched since the record was cleared (or
    /// since loading), in source-list order.
    pub fn entry_points_not_launched(&self) -> Vec<(KernelModule, &'static str)> {
        KernelModule::ALL
            .into_iter()
            .flat_map(|module| {
                module
                    .entry_points()
                    .iter()
                    .map(move |&name| (module, name))
            })
            .filter(|key| {
                self.functions
                    .get(key)
                    .is_none_or(|e| !e.launched.load(Ordering::Relaxed))
            })
            .collect()
    }
}

/// Runs `compile(i)` for every `i` of `which`, in order of `which`. NVRTC compiles concurrently
/// (it is documented thread-safe), on up to one thread per core; hiprtc one module at a time,
/// since older comgr releases are not safe to enter from several threads.
fn compile_all(
    device: &Device,
    which: &[usize],
    compile: &(dyn Fn(usize) -> Result<Vec<u8>> + Sync),
) -> Result<Vec<Vec<u8>>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(which.len());
    if device.platform() != PlatformKind::Nvidia || workers <= 1 {
        return which.iter().map(|&i| compile(i)).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Vec<u8>>>>> =
        which.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let slot = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = which.get(slot) else {
                    break;
                };
                let result = compile(i);
                *results[slot].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| {
                    Err(KernelError::Cache {
                        path: String::new(),
                        message: "a compile worker stopped without a result".to_string(),
                    })
                })
        })
        .collect()
}
