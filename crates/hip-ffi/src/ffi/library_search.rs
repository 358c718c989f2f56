//! Where the loaders look for the platforms' shared libraries when the loader's own search by
//! name does not find them. Shared by the runtimes ([`super::hip`], [`super::cuda`]), the
//! run-time compilers ([`super::rtc`]) and the BLAS libraries ([`super::blaslt`]), so that none
//! of them imports another for its search paths.

use std::path::PathBuf;

/// `<stem>.so`, `.so.7`, `.so.6`, `.so.5` by name (the loader's search), then the same under
/// `$HIP_PATH/lib`, `$ROCM_PATH/lib` and `/opt/rocm/lib`.
pub(crate) fn rocm_library_candidates(stem: &str) -> Vec<PathBuf> {
    let names = [
        format!("{stem}.so"),
        format!("{stem}.so.7"),
        format!("{stem}.so.6"),
        format!("{stem}.so.5"),
    ];
    let mut out: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    let mut roots: Vec<PathBuf> = ["HIP_PATH", "ROCM_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/opt/rocm"));
    for root in roots {
        for name in &names {
            out.push(root.join("lib").join(name));
        }
    }
    out
}

/// Directories searched when a library is not on the loader path: CUDA toolkit installs
/// (NVRTC ships with the toolkit, not the driver) and pip's `nvidia-cuda-nvrtc` wheels.
pub(crate) fn nvidia_library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(|root| PathBuf::from(root).join("lib64"))
        .collect();
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    for lib_root in python_lib_roots() {
        let Ok(entries) = std::fs::read_dir(&lib_root) else {
            continue;
        };
        for python in entries.flatten() {
            if !python.file_name().to_string_lossy().starts_with("python3") {
                continue;
            }
            for packages in ["dist-packages", "site-packages"] {
                let nvidia = python.path().join(packages).join("nvidia");
                for sub in ["cuda_nvrtc/lib", "cu13/lib", "cu12/lib"] {
                    dirs.push(nvidia.join(sub));
                }
            }
        }
    }
    dirs
}

/// Folders that hold `python3.*/{site,dist}-packages`: system, user (`pip install --user`), an
/// active virtual or conda environment, and pyenv installs.
fn python_lib_roots() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            roots.push(PathBuf::from(prefix).join("lib"));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        let home = PathBuf::from(home);
        roots.push(home.join(".local/lib"));
        if let Ok(versions) = std::fs::read_dir(home.join(".pyenv/versions")) {
            roots.extend(versions.flatten().map(|v| v.path().join("lib")));
        }
    }
    roots
}
