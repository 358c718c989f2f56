//! Shared helpers of the integration tests: running the Python (gguf-py) references.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use test_support::models::workspace_root;

pub fn reference_script(name: &str) -> PathBuf {
    workspace_root().join("tests/reference").join(name)
}

/// Whether python3 with the `gguf` package is available. When it is not: prints why the caller
/// skips and returns false, or panics under `HIPDECODE_REQUIRE_MODELS=1` (CI installs it).
pub fn gguf_py_available(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-P", "-c", "import gguf, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            !gguf_loader::paths::require_models(),
            "{test}: HIPDECODE_REQUIRE_MODELS=1 but python3 with the gguf package is missing; \
             pip install -r tests/reference/requirements.txt"
        );
        eprintln!("skipping {test}: python3 with the gguf package is not installed");
    }
    ok
}

/// Runs a reference script and returns its stdout, panicking with its stderr on failure.
pub fn run_reference(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("python3")
        .arg("-P")
        .arg(reference_script(script))
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("reference output is UTF-8")
}

pub fn sha256_f32_le(values: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut buf = Vec::with_capacity(values.len().min(1 << 16) * 4);
    for chunk in values.chunks(1 << 16) {
        buf.clear();
        for v in chunk {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        hasher.update(&buf);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
