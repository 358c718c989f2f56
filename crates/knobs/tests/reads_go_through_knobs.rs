//! No code in the workspace reads a `HIPDECODE_*` variable except through its knob.
//!
//! Every call of `std::env::var`, `var_os`, `vars` or `vars_os` outside this crate is found by a
//! scan of the sources. One that names a variable by a string literal passes when the name is
//! not a `HIPDECODE_` one (the runtimes' `HIP_VISIBLE_DEVICES`, cargo's `CARGO`, ...). One that
//! reads a name held in a variable, or passes the function itself, cannot be checked by the
//! scan, so it must be in [`INDIRECT`] with what it reads; every entry there must still match a
//! read, so the list stays true.

use std::path::{Path, PathBuf};

/// What [`reads`] gives for a read function passed by name (`filter_map(std::env::var_os)`).
const PASSED: &str = "<passed>";

/// Reads whose name is not a literal: (file, the call's argument text, what it reads).
const INDIRECT: &[(&str, &str, &str)] = &[
    (
        "crates/hip-ffi/src/ffi/library_search.rs",
        PASSED,
        "HIP_PATH and ROCM_PATH, CUDA_HOME and CUDA_PATH: where the runtimes may live",
    ),
    (
        "crates/hip-ffi/src/ffi/library_search.rs",
        "var",
        "VIRTUAL_ENV and CONDA_PREFIX, where pip's NVRTC may live",
    ),
    (
        "crates/hip-ffi/src/platform.rs",
        "var",
        "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, the runtimes' own",
    ),
    (
        "crates/rocm-kernels/src/cache.rs",
        "name",
        "XDG_CACHE_HOME and HOME, for the kernel cache's default folder",
    ),
    (
        "crates/hip-ffi/tests/cpu.rs",
        "CHILD",
        "HIP_FFI_TEST_CHILD, the test's marker for its own re-run",
    ),
    (
        "crates/rocm-kernels/tests/compile_all.rs",
        "CHILD_VAR",
        "ROCM_KERNELS_COMPILE_ALL_CHILD, the test's marker for its own re-run",
    ),
    (
        "xtask/src/verify_rocm.rs",
        "var",
        "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, printed in the report",
    ),
    (
        "crates/offload/src/measured.rs",
        "name",
        "XDG_CACHE_HOME and HOME, for the measured-rates file's default folder",
    ),
    (
        "crates/gguf-loader/tests/mapping_guard.rs",
        "CHILD_VAR",
        "GGUF_LOADER_TRUNCATE_CHILD, the test's marker for its own re-run",
    ),
    (
        "crates/hip-ffi/src/ffi/hip.rs",
        "crate::sysfs::HSA_OVERRIDE_GFX_VERSION",
        "HSA_OVERRIDE_GFX_VERSION, the ROCm runtime's own, read as the runtime reads it",
    ),
    (
        "xtask/src/verify_rocm.rs",
        "hip_ffi::sysfs::HSA_OVERRIDE_GFX_VERSION",
        "HSA_OVERRIDE_GFX_VERSION, printed in the report",
    ),
    (
        "crates/cli/src/selftest.rs",
        "hip_ffi::sysfs::HSA_OVERRIDE_GFX_VERSION",
        "HSA_OVERRIDE_GFX_VERSION, printed in the self-test's report",
    ),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            // Build outputs and hidden folders hold no sources of ours.
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The argument text of a call whose opening parenthesis starts `rest`, or [`PASSED`] for a
/// function passed by name.
fn argument(rest: &str) -> &str {
    let Some(inner) = rest.strip_prefix('(') else {
        return PASSED;
    };
    let mut depth = 1;
    for (i, c) in inner.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &inner[..i];
                }
            }
            _ => {}
        }
    }
    inner
}

/// Each environment read of `text`: (line number, argument text). Line comments are skipped.
fn reads(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut from = 0;
        while let Some(at) = code[from..].find("env::var") {
            let start = from + at + "env::".len();
            let name_end = code[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(code.len(), |e| start + e);
            let name = &code[start..name_end];
            if ["var", "var_os", "vars", "vars_os"].contains(&name) {
                out.push((n + 1, argument(&code[name_end..]).trim().to_string()));
            }
            from = name_end;
        }
    }
    out
}

#[test]
fn every_hipdecode_variable_is_read_through_its_knob() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("xtask"), &mut files);
    assert!(files.len() > 100, "the scan found {} files", files.len());
    let mut problems = Vec::new();
    let mut used = vec![false; INDIRECT.len()];
    for file in &files {
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("crates/knobs/") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (line, arg) in reads(&text) {
            let literal = arg.len() >= 2 && arg.starts_with('"') && arg.ends_with('"');
            if literal && !arg.contains("HIPDECODE") {
                continue;
            }
            if arg.is_empty() {
                problems.push(format!(
                    "{rel}:{line}: reads every variable; use knobs::Env"
                ));
                continue;
            }
            match INDIRECT.iter().position(|(f, a, _)| *f == rel && *a == arg) {
                Some(i) if !literal => used[i] = true,
                _ => problems.push(format!(
                    "{rel}:{line}: reads {arg} directly; define the variable as a knob in the \
                     crate's table and read it with `Knob::read`"
                )),
            }
        }
    }
    for ((file, arg, what), used) in INDIRECT.iter().zip(used) {
        if !used {
            problems.push(format!(
                "INDIRECT lists {file} reading {arg} ({what}), but no such read is there; \
                 remove the entry"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scan_finds_literal_indirect_and_passed_reads() {
    let text = r#"
        let a = std::env::var("HIPDECODE_X").ok(); // a comment: env::var("HIPDECODE_Y")
        let b = std::env::var_os(name);
        let c = ["A", "B"].iter().filter_map(std::env::var_os);
        let d = std::env::vars();
    "#;
    let found = reads(text);
    assert_eq!(
        found,
        vec![
            (2, "\"HIPDECODE_X\"".to_string()),
            (3, "name".to_string()),
            (4, PASSED.to_string()),
            (5, String::new()),
        ]
    );
}
