//! Chooses the HIP bindings.
//!
//! By default the committed bindings in `src/sys/` (made by `cargo xtask bindgen` from Debian's
//! HIP 5.2 headers) are used and bindgen is not even compiled. With the `generate-bindings`
//! feature, bindgen writes fresh bindings from the installed headers (`HIP_PATH`, `ROCM_PATH`,
//! `/opt/rocm`, `/usr/include/hip`) into `OUT_DIR` and the crate is compiled with
//! `cfg(hip_bindgen)`; when no headers are found or libclang does not load, a build warning says
//! so and the committed bindings are used. `HIP_FFI_USE_COMMITTED_BINDINGS=1` forces the
//! committed ones even with the feature.

#[cfg(feature = "generate-bindings")]
#[path = "build_support/hip_bindgen.rs"]
mod hip_bindgen;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hip_bindgen)");
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "generate-bindings")]
    generate();
}

#[cfg(feature = "generate-bindings")]
fn generate() {
    use std::path::PathBuf;

    println!("cargo::rerun-if-changed=build_support/hip_bindgen.rs");
    for var in [
        "HIP_PATH",
        "ROCM_PATH",
        "HIP_FFI_USE_COMMITTED_BINDINGS",
        "LIBCLANG_PATH",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }

    if std::env::var_os("HIP_FFI_USE_COMMITTED_BINDINGS").is_some_and(|v| v == "1") {
        return;
    }
    let candidates = hip_bindgen::candidate_include_dirs(
        std::env::var("HIP_PATH").ok().as_deref(),
        std::env::var("ROCM_PATH").ok().as_deref(),
    );
    let Some(include_dir) = hip_bindgen::find_include_dir(&candidates) else {
        println!(
            "cargo::warning=hip-ffi: generate-bindings is on but no hip/hip_runtime_api.h was \
             found in {candidates:?}; using the committed HIP bindings"
        );
        return;
    };
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };

    // bindgen panics when libclang cannot be loaded; that only means "use the committed files".
    let generated = std::panic::catch_unwind(|| {
        let runtime = hip_bindgen::generate(&include_dir, hip_bindgen::Library::Runtime)?;
        let rtc = hip_bindgen::generate(&include_dir, hip_bindgen::Library::Rtc)?;
        Ok::<_, String>((runtime, rtc))
    });
    match generated {
        Ok(Ok((runtime, rtc))) => {
            let write = |name: &str, text: &str| std::fs::write(out_dir.join(name), text).is_ok();
            if write(hip_bindgen::Library::Runtime.file_name(), &runtime)
                && write(hip_bindgen::Library::Rtc.file_name(), &rtc)
            {
                println!("cargo::rustc-cfg=hip_bindgen");
                println!(
                    "cargo::rerun-if-changed={}",
                    include_dir.join("hip/hip_runtime_api.h").display()
                );
            }
        }
        Ok(Err(message)) => {
            println!("cargo::warning=hip-ffi: using committed HIP bindings ({message})");
        }
        Err(_) => {
            println!(
                "cargo::warning=hip-ffi: using committed HIP bindings (libclang did not load)"
            );
        }
    }
}
