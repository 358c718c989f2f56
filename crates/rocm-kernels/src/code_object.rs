//! What each kernel of an AMD code object (HSACO) asks of the hardware, and whether the
//! launchers' blocks fit it (issue 28, item 2).
//!
//! [`read`] takes the image hiprtc returns (an ELF, or a clang offload bundle around one) and
//! reads the `NT_AMDGPU_METADATA` note, msgpack in code objects v3 to v5: per kernel its
//! register counts, spills, LDS (group segment), scratch (private segment) and the largest
//! block it was compiled for (`.max_flat_workgroup_size`, from `__launch_bounds__`). On RDNA it
//! also reads the kernel descriptor's WGP_MODE bit, which says over how many SIMDs a block's
//! waves spread.
//!
//! [`check_kernel`] holds one kernel to the rules: no spills and no scratch unless the caller
//! gives a reason for each, LDS within 64 KiB, the launcher's largest block within
//! `.max_flat_workgroup_size` and within what the register count lets one compute unit hold,
//! and `__launch_bounds__` no larger than that block. [`TargetLimits`] carries the register
//! file figures it needs; see there for where they come from.

use std::borrow::Cow;
use std::fmt;

/// Why a code object could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the AMD code object: {0}")]
pub struct CodeObjectError(String);

fn fail<T>(message: impl Into<String>) -> Result<T, CodeObjectError> {
    Err(CodeObjectError(message.into()))
}

/// One kernel's resource usage, as its code object's metadata records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's name (`.name`).
    pub name: String,
    /// VGPRs per lane (`.vgpr_count`). On gfx90a and later CDNA this is the unified count,
    /// architectural VGPRs and AGPRs together, which is what occupancy is reckoned on.
    pub vgpr_count: u32,
    /// AGPRs per lane (`.agpr_count`; 0 where the target has none).
    pub agpr_count: u32,
    /// SGPRs per wave (`.sgpr_count`).
    pub sgpr_count: u32,
    /// VGPRs spilled to scratch (`.vgpr_spill_count`).
    pub vgpr_spill_count: u32,
    /// SGPRs spilled (`.sgpr_spill_count`).
    pub sgpr_spill_count: u32,
    /// Static LDS per block, bytes (`.group_segment_fixed_size`; dynamic LDS comes on top).
    pub group_segment_fixed_size: u32,
    /// Scratch per lane, bytes (`.private_segment_fixed_size`).
    pub private_segment_fixed_size: u32,
    /// The largest block the kernel was compiled for (`.max_flat_workgroup_size`).
    pub max_flat_workgroup_size: u32,
    /// Lanes per wave (`.wavefront_size`).
    pub wavefront_size: u32,
    /// Whether it uses a stack whose size the compiler could not bound (`.uses_dynamic_stack`).
    pub uses_dynamic_stack: bool,
    /// RDNA only: whether blocks run in WGP mode (over the 4 SIMDs of a workgroup processor)
    /// rather than CU mode (the 2 SIMDs of one compute unit), from the kernel descriptor's
    /// COMPUTE_PGM_RSRC1.WGP_MODE; `None` where the descriptor was not found or the target
    /// has no such mode.
    pub wgp_mode: Option<bool>,
}

/// The kernels of one code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// `amdhsa.target`, e.g. `amdgcn-amd-amdhsa--gfx90a`.
    pub target: String,
    /// Every kernel, in the metadata's order.
    pub kernels: Vec<KernelResources>,
}

/// `NT_AMDGPU_METADATA` (owner "AMDGPU"): msgpack metadata of code objects v3 and later.
const NT_AMDGPU_METADATA: u32 = 32;
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
const COMPRESSED_BUNDLE_MAGIC: &[u8] = b"CCOB";
/// Offset of COMPUTE_PGM_RSRC1 in a 64-byte kernel descriptor, and its WGP_MODE bit (GFX10+);
/// AMDGPUUsage, "Kernel Descriptor" and "compute_pgm_rsrc1 for GFX6-GFX12".
const KD_PGM_RSRC1: usize = 48;
const RSRC1_WGP_MODE: u32 = 1 << 29;

/// The ELF inside `image`: `image` itself, or the amdgcn entry of a clang offload bundle.
pub fn elf_image(image: &[u8]) -> Result<Cow<'_, [u8]>, CodeObjectError> {
    if image.starts_with(b"\x7fELF") {
        return Ok(Cow::Borrowed(image));
    }
    if image.starts_with(COMPRESSED_BUNDLE_MAGIC) {
        return fail(
            "it is a compressed offload bundle, which is not read here; compile without \
             offload compression (hiprtc does not compress unless asked)",
        );
    }
    if !image.starts_with(BUNDLE_MAGIC) {
        return fail("it is neither an ELF file nor a clang offload bundle");
    }
    let u64_at = |at: usize| -> Result<u64, CodeObjectError> {
        match image.get(at..at + 8) {
            Some(b) => Ok(u64::from_le_bytes(b.try_into().unwrap_or_default())),
            None => fail("the offload bundle is truncated"),
        }
    };
    let entries = u64_at(BUNDLE_MAGIC.len())?;
    let mut at = BUNDLE_MAGIC.len() + 8;
    for _ in 0..entries {
        let (offset, size, id_len) = (u64_at(at)?, u64_at(at + 8)?, u64_at(at + 16)?);
        at += 24;
        let id_end = at.saturating_add(id_len as usize);
        let Some(id) = image.get(at..id_end) else {
            return fail("the offload bundle is truncated");
        };
        at = id_end;
        if size == 0 || !id.windows(6).any(|w| w == b"amdgcn") {
            continue;
        }
        let start = offset as usize;
        return match image.get(start..start.saturating_add(size as usize)) {
            Some(elf) if elf.starts_with(b"\x7fELF") => Ok(Cow::Owned(elf.to_vec())),
            _ => fail(format!(
                "the bundle entry {} does not hold an ELF file",
                String::from_utf8_lossy(id)
            )),
        };
    }
    fail("the offload bundle has no amdgcn code object")
}

/// Reads the kernels' resource usage from a code object (see the module docs).
pub fn read(image: &[u8]) -> Result<CodeObject, CodeObjectError> {
    use object::read::elf::{FileHeader, SectionHeader, Sym};
    let elf = elf_image(image)?;
    let data: &[u8] = &elf;
    let bad = |e: object::read::Error| CodeObjectError(format!("malformed ELF: {e}"));
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    let sections = header.sections(endian, data).map_err(bad)?;

    let mut metadata = None;
    for section in sections.iter() {
        let Some(mut notes) = section.notes(endian, data).map_err(bad)? else {
            continue;
        };
        while let Some(note) = notes.next().map_err(bad)? {
            if note.name() == b"AMDGPU" && note.n_type(endian).0 == NT_AMDGPU_METADATA {
                metadata = Some(note.desc());
            }
        }
    }
    let Some(metadata) = metadata else {
        return fail(
            "it has no NT_AMDGPU_METADATA note (code object v2 and older keep YAML metadata \
             under another note, which is not read here; compile for code object v3 or later)",
        );
    };
    let mut object = parse_metadata(metadata)?;

    // The kernel descriptors `<symbol>.kd`, for RDNA's WGP_MODE bit.
    if object.target.contains("gfx1") {
        let symbols = sections
            .symbols(endian, data, object::elf::SHT_SYMTAB)
            .map_err(bad)?;
        for kernel in &mut object.kernels {
            let wanted = format!("{}.kd", kernel.name);
            let descriptor = symbols.iter().find_map(|sym| {
                let name = sym.name(endian, symbols.strings()).ok()?;
                if name != wanted.as_bytes() {
                    return None;
                }
                let index = sym.st_shndx(endian).index()?;
                let section = sections.section(object::SectionIndex(index.into())).ok()?;
                let bytes = section.data(endian, data).ok()?;
                let at = sym.st_value(endian).checked_sub(section.sh_addr(endian))? as usize;
                bytes.get(at..at + 64)
            });
            kernel.wgp_mode = descriptor.map(|kd| {
                let rsrc1 = u32::from_le_bytes(
                    kd[KD_PGM_RSRC1..KD_PGM_RSRC1 + 4]
                        .try_into()
                        .unwrap_or_default(),
                );
                rsrc1 & RSRC1_WGP_MODE != 0
            });
        }
    }
    Ok(object)
}

/// The kernels of a msgpack `NT_AMDGPU_METADATA` descriptor.
pub fn parse_metadata(msgpack: &[u8]) -> Result<CodeObject, CodeObjectError> {
    let root = rmpv::decode::read_value(&mut &msgpack[..])
        .map_err(|e| CodeObjectError(format!("the metadata is not msgpack: {e}")))?;
    let target = field(&root, "amdhsa.target")
        .and_then(rmpv::Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(kernels) = field(&root, "amdhsa.kernels").and_then(rmpv::Value::as_array) else {
        return fail("the metadata has no amdhsa.kernels list");
    };
    let kernels = kernels
        .iter()
        .map(|k| {
            let name = field(k, ".name")
                .and_then(rmpv::Value::as_str)
                .ok_or_else(|| CodeObjectError("a kernel's metadata has no .name".into()))?;
            let number = |key: &str| -> Result<u32, CodeObjectError> {
                match field(k, key) {
                    None => Ok(0),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            CodeObjectError(format!("{name}: {key} is not a 32-bit count: {v}"))
                        }),
                }
            };
            let required = |key: &str| -> Result<u32, CodeObjectError> {
                match field(k, key) {
                    Some(_) => number(key),
                    None => fail(format!("{name}: the metadata has no {key}")),
                }
            };
            Ok(KernelResources {
                name: name.to_string(),
                vgpr_count: required(".vgpr_count")?,
                agpr_count: number(".agpr_count")?,
                sgpr_count: required(".sgpr_count")?,
                vgpr_spill_count: number(".vgpr_spill_count")?,
                sgpr_spill_count: number(".sgpr_spill_count")?,
                group_segment_fixed_size: required(".group_segment_fixed_size")?,
                private_segment_fixed_size: required(".private_segment_fixed_size")?,
                max_flat_workgroup_size: required(".max_flat_workgroup_size")?,
                wavefront_size: required(".wavefront_size")?,
                uses_dynamic_stack: field(k, ".uses_dynamic_stack")
                    .and_then(rmpv::Value::as_bool)
                    .unwrap_or(false),
                wgp_mode: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CodeObject { target, kernels })
}

fn field<'a>(map: &'a rmpv::Value, key: &str) -> Option<&'a rmpv::Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// What a compute unit offers one block on a target, from LLVM's AMDGPU backend
/// (`llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp`, the functions named on each field),
/// which is what the compiler itself allocates registers against.
///
/// The rule [`TargetLimits::largest_block`] applies: a block of B threads is ceil(B / W) waves
/// of W lanes, spread over the SIMDs that share it (4 in a GCN/CDNA compute unit and in an
/// RDNA workgroup processor in WGP mode, 2 in RDNA's CU mode: `getEUsPerCU`), so each of those
/// SIMDs must hold ceil(waves / SIMDs) of them at once. A SIMD holds as many waves as its VGPR
/// file has room for, each taking the kernel's VGPR count rounded up to the allocation
/// granule, and never more than its wave slots (`getNumWavesPerEUWithNumVGPRs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetLimits {
    /// Lanes per wave.
    pub wave_size: u32,
    /// VGPRs per lane in one SIMD's register file, shared by its waves (`getTotalNumVGPRs`).
    pub vgprs_per_simd: u32,
    /// VGPRs are allocated in multiples of this (`getVGPRAllocGranule`).
    pub vgpr_granule: u32,
    /// The most waves one SIMD holds (`getMaxWavesPerEU`).
    pub max_waves_per_simd: u32,
    /// SIMDs a block's waves share when the kernel does not say (GCN/CDNA: the 4 of a compute
    /// unit; RDNA: the 2 of a compute unit, CU mode, the narrower of its two modes).
    pub simds_per_block: u32,
    /// RDNA: SIMDs in WGP mode, when the kernel descriptor says it runs so.
    pub simds_per_block_wgp: u32,
    /// LDS one block may address, bytes (`getAddressableLocalMemorySize`).
    pub lds_bytes: u32,
    /// The largest block any kernel may have (`getMaxFlatWorkGroupSize`).
    pub max_block: u32,
}

impl TargetLimits {
    /// The figures of `arch` (target features after `:` ignored) in waves of `wave_size`, or
    /// `None` for a target not described here.
    pub fn for_target(arch: &str, wave_size: u32) -> Option<TargetLimits> {
        let arch = arch.split(':').next().unwrap_or(arch);
        let cdna = |max_waves| TargetLimits {
            wave_size: 64,
            vgprs_per_simd: 512,
            vgpr_granule: 8,
            max_waves_per_simd: max_waves,
            simds_per_block: 4,
            simds_per_block_wgp: 4,
            lds_bytes: 65536,
            max_block: 1024,
        };
        let rdna = |granule32: u32, max_waves| TargetLimits {
            wave_size,
            // Twice the registers per lane in wave32: the same file, half as wide a wave.
            vgprs_per_simd: if wave_size == 32 { 1024 } else { 512 },
            vgpr_granule: if wave_size == 32 {
                granule32
            } else {
                granule32 / 2
            },
            max_waves_per_simd: max_waves,
            simds_per_block: 2,
            simds_per_block_wgp: 4,
            lds_bytes: 65536,
            max_block: 1024,
        };
        match (arch, wave_size) {
            // CDNA 2 and 3: one file of 512 per lane for VGPRs and AGPRs together.
            ("gfx90a", 64) => Some(cdna(8)),
            ("gfx940" | "gfx941" | "gfx942", 64) => Some(cdna(8)),
            // RDNA 1 (GFX10.1) and RDNA 2 (GFX10.3).
            ("gfx1010" | "gfx1011" | "gfx1012" | "gfx1013", 32 | 64) => Some(rdna(8, 20)),
            (
                "gfx1030" | "gfx1031" | "gfx1032" | "gfx1033" | "gfx1034" | "gfx1035" | "gfx1036",
                32 | 64,
            ) => Some(rdna(16, 16)),
            _ => None,
        }
    }

    /// Waves one SIMD holds for a kernel of `vgprs` VGPRs per lane.
    pub fn waves_per_simd(&self, vgprs: u32) -> u32 {
        let granule = self.vgpr_granule.max(1);
        let rounded = vgprs.max(1).div_ceil(granule) * granule;
        (self.vgprs_per_simd / rounded).clamp(1, self.max_waves_per_simd)
    }

    /// SIMDs a block of the kernel spreads over (see the fields).
    pub fn simds_for(&self, kernel: &KernelResources) -> u32 {
        match kernel.wgp_mode {
            Some(true) => self.simds_per_block_wgp,
            _ => self.simds_per_block,
        }
    }

    /// The largest block one compute unit can hold at once for `kernel`'s VGPR count: whole
    /// waves, at most `waves_per_simd` on each of the SIMDs the block shares, and at most
    /// `max_block` threads.
    pub fn largest_block(&self, kernel: &KernelResources) -> u32 {
        let waves = self.waves_per_simd(kernel.vgpr_count) * self.simds_for(kernel);
        (waves * self.wave_size).min(self.max_block)
    }
}

/// A rule a kernel breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Registers spilled to scratch memory.
    Spills {
        /// VGPRs spilled.
        vgprs: u32,
        /// SGPRs spilled.
        sgprs: u32,
    },
    /// Scratch memory per lane, with no reason given for it.
    PrivateSegment {
        /// Bytes per lane.
        bytes: u32,
    },
    /// More static LDS than a block may address.
    LdsOverLimit {
        /// Bytes the kernel declares.
        bytes: u32,
        /// Bytes a block may address.
        limit: u32,
    },
    /// The launcher's largest block is larger than the kernel was compiled for.
    BlockOverMaxFlat {
        /// The launcher's largest block.
        block: u32,
        /// `.max_flat_workgroup_size`.
        max_flat: u32,
    },
    /// The launcher's largest block does not fit one compute unit at the kernel's VGPR count.
    BlockOverVgprs {
        /// The launcher's largest block.
        block: u32,
        /// The kernel's VGPRs per lane.
        vgprs: u32,
        /// The largest block that count allows.
        largest: u32,
    },
    /// `__launch_bounds__` larger than any block the launcher uses: the compiler budgets
    /// registers for blocks that never come.
    BoundsAboveBlock {
        /// `.max_flat_workgroup_size`.
        max_flat: u32,
        /// The launcher's largest block.
        block: u32,
    },
    /// The compiler refused the program (for instance LDS above the limit, which hiprtc
    /// reports as an error rather than in the metadata).
    CompilerRefused {
        /// The compiler's log.
        log: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Spills { vgprs, sgprs } => write!(
                f,
                "spills {vgprs} VGPRs and {sgprs} SGPRs to scratch; keep fewer values live (or \
                 smaller __launch_bounds__, which leaves more registers per lane)"
            ),
            Violation::PrivateSegment { bytes } => write!(
                f,
                "uses {bytes} bytes of scratch per lane (a local array indexed at run time, or \
                 a stack); keep it in registers, or list the kernel with the reason"
            ),
            Violation::LdsOverLimit { bytes, limit } => write!(
                f,
                "declares {bytes} bytes of LDS, above the {limit} a block may address; make its \
                 shared arrays smaller"
            ),
            Violation::BlockOverMaxFlat { block, max_flat } => write!(
                f,
                "its launcher uses blocks of {block} threads but it was compiled for at most \
                 {max_flat} (.max_flat_workgroup_size); raise its __launch_bounds__ to {block}"
            ),
            Violation::BlockOverVgprs {
                block,
                vgprs,
                largest,
            } => write!(
                f,
                "at {vgprs} VGPRs per lane one compute unit holds blocks of at most {largest} \
                 threads, but its launcher uses {block}; declare __launch_bounds__({block}) so \
                 the compiler budgets for it, or launch smaller blocks"
            ),
            Violation::BoundsAboveBlock { max_flat, block } => write!(
                f,
                "was compiled for blocks of up to {max_flat} threads but its launcher's largest \
                 is {block}; set its __launch_bounds__ to {block} (and keep the launch-bounds \
                 table in step)"
            ),
            Violation::CompilerRefused { log } => {
                write!(f, "the compiler refused it: {}", log.trim())
            }
        }
    }
}

/// What the caller knows of a kernel that its code object does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPolicy<'a> {
    /// The largest block (threads) its launcher uses on this target.
    pub launch_block: u32,
    /// Why its register spills are accepted for now, if they are (a known debt, not a rule).
    pub spill_reason: Option<&'a str>,
    /// Why scratch memory is acceptable for it, if it is.
    pub private_segment_reason: Option<&'a str>,
}

/// Every rule `kernel` breaks on a target of `limits` (see the module docs).
pub fn check_kernel(
    kernel: &KernelResources,
    limits: &TargetLimits,
    policy: &KernelPolicy<'_>,
) -> Vec<Violation> {
    let mut broken = Vec::new();
    let spills = kernel.vgpr_spill_count > 0 || kernel.sgpr_spill_count > 0;
    if spills && policy.spill_reason.is_none() {
        broken.push(Violation::Spills {
            vgprs: kernel.vgpr_spill_count,
            sgprs: kernel.sgpr_spill_count,
        });
    }
    if kernel.private_segment_fixed_size > 0 && policy.private_segment_reason.is_none() {
        broken.push(Violation::PrivateSegment {
            bytes: kernel.private_segment_fixed_size,
        });
    }
    if kernel.group_segment_fixed_size > limits.lds_bytes {
        broken.push(Violation::LdsOverLimit {
            bytes: kernel.group_segment_fixed_size,
            limit: limits.lds_bytes,
        });
    }
    let block = policy.launch_block;
    if block > kernel.max_flat_workgroup_size {
        broken.push(Violation::BlockOverMaxFlat {
            block,
            max_flat: kernel.max_flat_workgroup_size,
        });
    } else if kernel.max_flat_workgroup_size > block {
        broken.push(Violation::BoundsAboveBlock {
            max_flat: kernel.max_flat_workgroup_size,
            block,
        });
    }
    let largest = limits.largest_block(kernel);
    if block > largest {
        broken.push(Violation::BlockOverVgprs {
            block,
            vgprs: kernel.vgpr_count,
            largest,
        });
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gfx90a() -> TargetLimits {
        TargetLimits::for_target("gfx90a:xnack-", 64).expect("gfx90a")
    }

    fn kernel(vgprs: u32, max_flat: u32) -> KernelResources {
        KernelResources {
            name: "k".into(),
            vgpr_count: vgprs,
            sgpr_count: 20,
            max_flat_workgroup_size: max_flat,
            wavefront_size: 64,
            ..KernelResources::default()
        }
    }

    fn policy(block: u32) -> KernelPolicy<'static> {
        KernelPolicy {
            launch_block: block,
            spill_reason: None,
            private_segment_reason: None,
        }
    }

    #[test]
    fn register_file_rule_matches_the_documented_figures() {
        let cdna = gfx90a();
        // 512 VGPRs per lane and SIMD, granule 8, 8 waves at most.
        assert_eq!(cdna.waves_per_simd(1), 8);
        assert_eq!(cdna.waves_per_simd(64), 8);
        assert_eq!(cdna.waves_per_simd(65), 7); // 72 rounded: 512 / 72
        assert_eq!(cdna.waves_per_simd(128), 4);
        assert_eq!(cdna.waves_per_simd(512), 1);
        // 1024 threads are 16 waves: 4 on each of the 4 SIMDs, so 128 VGPRs at most.
        assert_eq!(cdna.largest_block(&kernel(128, 1024)), 1024);
        assert_eq!(cdna.largest_block(&kernel(129, 1024)), 768);
        let rdna = TargetLimits::for_target("gfx1030", 32).expect("gfx1030");
        // 1024 VGPRs per lane in wave32, granule 16, 16 waves; CU mode: 2 SIMDs.
        assert_eq!(rdna.waves_per_simd(64), 16);
        assert_eq!(rdna.waves_per_simd(65), 12); // 80 rounded: 1024 / 80
        let mut k = kernel(64, 1024);
        k.wavefront_size = 32;
        assert_eq!(rdna.largest_block(&k), 1024);
        k.vgpr_count = 65;
        assert_eq!(rdna.largest_block(&k), 768);
        // In WGP mode the block spreads over 4 SIMDs.
        k.wgp_mode = Some(true);
        assert_eq!(rdna.largest_block(&k), 1024);
        assert_eq!(TargetLimits::for_target("gfx1100", 32), None);
        assert_eq!(TargetLimits::for_target("gfx90a", 32), None);
    }

    #[test]
    fn a_clean_kernel_passes() {
        assert_eq!(check_kernel(&kernel(40, 256), &gfx90a(), &policy(256)), []);
    }

    #[test]
    fn each_rule_rejects_its_own_defect() {
        let limits = gfx90a();
        let mut spills = kernel(128, 1024);
        spills.vgpr_spill_count = 117;
        assert_eq!(
            check_kernel(&spills, &limits, &policy(1024)),
            [Violation::Spills {
                vgprs: 117,
                sgprs: 0
            }]
        );

        let mut scratch = kernel(40, 256);
        scratch.private_segment_fixed_size = 64;
        assert_eq!(
            check_kernel(&scratch, &limits, &policy(256)),
            [Violation::PrivateSegment { bytes: 64 }]
        );
        let listed = KernelPolicy {
            private_segment_reason: Some("an indexed table"),
            ..policy(256)
        };
        assert_eq!(check_kernel(&scratch, &limits, &listed), []);
        let excused = KernelPolicy {
            spill_reason: Some("a known debt"),
            ..policy(1024)
        };
        assert_eq!(check_kernel(&spills, &limits, &excused), []);

        let mut lds = kernel(40, 256);
        lds.group_segment_fixed_size = 69632;
        assert_eq!(
            check_kernel(&lds, &limits, &policy(256)),
            [Violation::LdsOverLimit {
                bytes: 69632,
                limit: 65536
            }]
        );

        assert_eq!(
            check_kernel(&kernel(40, 256), &limits, &policy(512)),
            [Violation::BlockOverMaxFlat {
                block: 512,
                max_flat: 256
            }]
        );
        assert_eq!(
            check_kernel(&kernel(40, 1024), &limits, &policy(256)),
            [Violation::BoundsAboveBlock {
                max_flat: 1024,
                block: 256
            }]
        );
        assert_eq!(
            check_kernel(&kernel(200, 1024), &limits, &policy(1024)),
            [Violation::BlockOverVgprs {
                block: 1024,
                vgprs: 200,
                largest: 512
            }]
        );
        for v in [
            Violation::Spills { vgprs: 1, sgprs: 0 },
            Violation::BlockOverVgprs {
                block: 1024,
                vgprs: 200,
                largest: 512,
            },
        ] {
            assert!(v.to_string().contains("; "), "names the fix: {v}");
        }
    }

    /// A msgpack encoding of `value`.
    fn msgpack(value: &rmpv::Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).expect("encode");
        out
    }

    fn entry(key: &str, value: impl Into<rmpv::Value>) -> (rmpv::Value, rmpv::Value) {
        (rmpv::Value::from(key), value.into())
    }

    #[test]
    fn metadata_is_read_from_msgpack() {
        let kernel = rmpv::Value::Map(vec![
            entry(".name", "spill"),
            entry(".symbol", "spill.kd"),
            entry(".vgpr_count", 128),
            entry(".agpr_count", 0),
            entry(".sgpr_count", 12),
            entry(".vgpr_spill_count", 117),
            entry(".sgpr_spill_count", 0),
            entry(".group_segment_fixed_size", 0),
            entry(".private_segment_fixed_size", 1520),
            entry(".max_flat_workgroup_size", 1024),
            entry(".wavefront_size", 64),
            entry(".uses_dynamic_stack", false),
        ]);
        let root = rmpv::Value::Map(vec![
            entry("amdhsa.kernels", rmpv::Value::Array(vec![kernel.clone()])),
            entry("amdhsa.target", "amdgcn-amd-amdhsa--gfx90a"),
        ]);
        let object = parse_metadata(&msgpack(&root)).expect("parses");
        assert_eq!(object.target, "amdgcn-amd-amdhsa--gfx90a");
        assert_eq!(object.kernels.len(), 1);
        let k = &object.kernels[0];
        assert_eq!(
            (k.name.as_str(), k.vgpr_count, k.vgpr_spill_count),
            ("spill", 128, 117)
        );
        assert_eq!(
            (k.private_segment_fixed_size, k.max_flat_workgroup_size),
            (1520, 1024)
        );

        // A missing required field is named.
        let rmpv::Value::Map(mut fields) = kernel else {
            unreachable!()
        };
        fields.retain(|(k, _)| k.as_str() != Some(".vgpr_count"));
        let root = rmpv::Value::Map(vec![entry(
            "amdhsa.kernels",
            rmpv::Value::Array(vec![rmpv::Value::Map(fields)]),
        )]);
        let err = parse_metadata(&msgpack(&root)).expect_err("no .vgpr_count");
        assert!(err.to_string().contains(".vgpr_count"), "{err}");
    }

    #[test]
    fn bundles_are_unwrapped_and_other_data_refused() {
        // A bundle of a host entry (empty) and an amdgcn entry holding a (fake) ELF.
        let elf = b"\x7fELF-payload".to_vec();
        let ids: [&[u8]; 2] = [
            b"host-x86_64-unknown-linux",
            b"hipv4-amdgcn-amd-amdhsa--gfx90a",
        ];
        let header_len = BUNDLE_MAGIC.len() + 8 + ids.iter().map(|id| 24 + id.len()).sum::<usize>();
        let mut bundle = BUNDLE_MAGIC.to_vec();
        bundle.extend(2u64.to_le_bytes());
        for (id, (offset, size)) in ids
            .iter()
            .zip([(0u64, 0u64), (header_len as u64, elf.len() as u64)])
        {
            bundle.extend(offset.to_le_bytes());
            bundle.extend(size.to_le_bytes());
            bundle.extend((id.len() as u64).to_le_bytes());
            bundle.extend(*id);
        }
        bundle.extend(&elf);
        assert_eq!(
            elf_image(&bundle).expect("unwraps").as_ref(),
            elf.as_slice()
        );
        assert_eq!(elf_image(&elf).expect("as is").as_ref(), elf.as_slice());
        for junk in [&b"CCOB...."[..], b"not a code object", &bundle[..40]] {
            assert!(elf_image(junk).is_err());
        }
        let err = read(b"\x7fELF").expect_err("truncated");
        assert!(err.to_string().contains("malformed ELF"), "{err}");
    }
}
