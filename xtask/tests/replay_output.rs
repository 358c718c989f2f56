//! `cargo xtask replay` writes its report as command line tools do: into a closed pipe it ends
//! quietly with status 141, onto a full disk it fails with a message naming standard output,
//! and it never panics.

use std::io::Read;
use std::process::{Command, Stdio};

fn replay(stdout: Stdio) -> std::process::Child {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/rocm-alloc/tests/traces/chat-8b-eager.jsonl");
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("replay")
        .arg(trace)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("xtask runs")
}

#[test]
fn a_closed_pipe_or_a_full_disk_ends_the_replay_as_command_line_tools_end() {
    let mut child = replay(Stdio::piped());
    let mut first = [0u8; 6];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    assert_eq!(&first, b"trace:");
    // The read end is dropped here: the report's table meets a closed pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = replay(full.into()).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("writing to standard output") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
