//! Run-time compilation without a GPU: hiprtc for gfx targets, NVRTC for sm targets.
//!
//! Each compiler that is not installed makes its test print `SKIP <test>: <reason>`;
//! `HIPDECODE_REQUIRE_RTC=1` (set by CI, which installs both) turns that skip into a failure.

use hip_ffi::knobs::REQUIRE_RTC;
use hip_ffi::{Compiler, ErrorKind, PlatformKind};

/// A kernel that only compiles when the compiler got the warp size the test expects.
const SOURCE: &str = r#"
#ifndef WARP_SIZE
#error "WARP_SIZE was not defined by the compiler options"
#endif
#if WARP_SIZE != EXPECTED_WARP_SIZE
#error "WARP_SIZE does not match the requested wave size"
#endif
extern "C" __global__ void scale(float* data, unsigned int n, float factor) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = data[i] * factor + (float)(threadIdx.x % WARP_SIZE);
}
"#;

fn compiler_or_skip(test: &str, platform: PlatformKind) -> Option<Compiler> {
    let required = hip_ffi::testing::required(&REQUIRE_RTC, test);
    match Compiler::load(platform) {
        Ok(compiler) => Some(compiler),
        Err(e) if required => panic!("{test}: {}=1 but {e}", REQUIRE_RTC.name),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

/// The ELF `e_flags` word of a code object (both HSACO and CUBIN are ELF64 little-endian).
fn elf_flags(image: &[u8]) -> u32 {
    assert!(image.len() > 64, "code object of {} bytes", image.len());
    assert_eq!(&image[..4], b"\x7fELF", "not an ELF code object");
    assert_eq!(image[4], 2, "not ELF64");
    u32::from_le_bytes(image[48..52].try_into().expect("4 bytes"))
}

fn expected_warp(wave: u32) -> Vec<String> {
    vec![format!("-DEXPECTED_WARP_SIZE={wave}")]
}

#[test]
fn hiprtc_compiles_for_gfx_targets_without_a_gpu() {
    let test = "hiprtc_compiles_for_gfx_targets_without_a_gpu";
    let Some(compiler) = compiler_or_skip(test, PlatformKind::Amd) else {
        return;
    };
    let version = compiler.version();
    assert!(version.starts_with("hiprtc "), "{version}");
    eprintln!("{test}: {version}");
    // EF_AMDGPU_MACH values from LLVM's AMDGPU ELF ABI: the low byte of e_flags names the
    // target, so this proves --offload-arch reached the compiler.
    for (arch, wave, mach) in [("gfx90a", 64, 0x3f), ("gfx1030", 32, 0x36)] {
        let image = compiler
            .compile(SOURCE, "scale.hip", arch, wave, &expected_warp(wave))
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(elf_flags(&image) & 0xff, mach, "{arch}: e_flags machine");
    }
    let mismatch = compiler
        .compile(SOURCE, "scale.hip", "gfx90a", 64, &expected_warp(32))
        .expect_err("WARP_SIZE 64 must fail the EXPECTED 32 check");
    assert_eq!(mismatch.kind, ErrorKind::Compile);
    let log = mismatch.detail.unwrap_or_default();
    assert!(log.contains("does not match"), "the log is attached: {log}");
}

#[test]
fn nvrtc_compiles_for_sm_targets_without_a_gpu() {
    let test = "nvrtc_compiles_for_sm_targets_without_a_gpu";
    let Some(compiler) = compiler_or_skip(test, PlatformKind::Nvidia) else {
        return;
    };
    let version = compiler.version();
    assert!(version.starts_with("NVRTC "), "{version}");
    eprintln!("{test}: {version}");
    let sm90 = compiler
        .compile(SOURCE, "scale.cu", "sm_90", 32, &expected_warp(32))
        .unwrap_or_else(|e| panic!("sm_90: {e}"));
    let sm80 = compiler
        .compile(SOURCE, "scale.cu", "sm_80", 32, &expected_warp(32))
        .unwrap_or_else(|e| panic!("sm_80: {e}"));
    // A CUBIN's e_flags carry the SM version; two targets must not produce the same header.
    assert_ne!(elf_flags(&sm90), elf_flags(&sm80), "the arch reached NVRTC");

    let broken = compiler
        .compile(
            "extern \"C\" __global__ void broken( {",
            "broken.cu",
            "sm_90",
            32,
            &[],
        )
        .expect_err("syntax error");
    assert_eq!(broken.kind, ErrorKind::Compile);
    let log = broken.detail.unwrap_or_default();
    assert!(log.contains("broken.cu"), "the log names the file: {log}");
}

#[test]
fn a_target_of_the_wrong_platform_is_refused_before_compiling() {
    let test = "a_target_of_the_wrong_platform_is_refused_before_compiling";
    for (platform, arch) in [
        (PlatformKind::Amd, "sm_90"),
        (PlatformKind::Nvidia, "gfx90a"),
    ] {
        let Some(compiler) = compiler_or_skip(test, platform) else {
            continue;
        };
        let err = compiler
            .compile(SOURCE, "x", arch, 32, &expected_warp(32))
            .expect_err(arch);
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    }
}
