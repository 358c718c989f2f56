//! A model file truncated while mapped: reading past the new end ends the process with a
//! message naming the file and status 1, not a bare SIGBUS.
//!
//! The fault kills whatever process takes it, so the test runs itself again as a child (with
//! `GGUF_LOADER_TRUNCATE_CHILD` naming the file) and checks how the child ended.

use gguf_loader::file::GgufFile;
use gguf_loader::synth::{write_preset, Preset};
use std::path::Path;
use std::process::Command;

const CHILD_VAR: &str = "GGUF_LOADER_TRUNCATE_CHILD";

/// In the child: maps the file, truncates it to its header, then sums every tensor's bytes.
fn truncate_and_read(path: &Path) -> ! {
    let file = GgufFile::open(path).expect("the file opens");
    let header = file.data_start();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(header))
        .expect("the file is truncated");
    let sum: u64 = file
        .tensors()
        .iter()
        .flat_map(|t| file.tensor_data(t).iter())
        .map(|&b| b as u64)
        .sum();
    // Not reached when the guard works: the pages past the header are gone.
    println!("read every tensor after truncation, sum {sum}");
    std::process::exit(0)
}

#[test]
fn a_file_truncated_while_mapped_ends_the_run_with_a_message_naming_it() {
    if let Some(path) = std::env::var_os(CHILD_VAR) {
        truncate_and_read(Path::new(&path));
    }
    let dir = std::env::temp_dir().join(format!("gguf-truncate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-llama.gguf");
    write_preset(Preset::TinyLlama, &path, 0).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_file_truncated_while_mapped_ends_the_run_with_a_message_naming_it",
            "--nocapture",
        ])
        .env(CHILD_VAR, &path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("child: {:?}\n{stderr}", out.status);
    assert_eq!(out.status.code(), Some(1), "the child ends with status 1");
    assert!(
        stderr.contains(&*path.to_string_lossy()) && stderr.contains("changed while in use"),
        "the message names the file and says it changed: {stderr}"
    );
}
