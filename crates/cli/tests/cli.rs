//! The `hipdecode` binary end to end on a tiny synthetic model.

#[path = "../../decode/tests/common.rs"]
mod common;

use decode::gguf_loader::synth::{write_preset, Preset};
use std::process::Command;

fn hipdecode() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hipdecode"))
}

fn tiny_model(tag: &str) -> std::path::PathBuf {
    let path = common::scratch_dir().join(format!("cli-{tag}-{}.gguf", std::process::id()));
    write_preset(Preset::TinyQwen3, &path, 5).unwrap();
    path
}

#[test]
fn run_streams_a_continuation_and_reports_speed_and_memory() {
    let model = tiny_model("run");
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(&model)
        .args([
            "-p",
            "hello world",
            "-n",
            "5",
            "--temp",
            "0",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("hello world"), "{stdout}");
    assert!(stderr.contains("tok/s"), "{stderr}");
    assert!(stderr.contains("kv_cache"), "{stderr}");
    // The load's time, and no progress bar where standard error is not a terminal.
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains(": loaded in ") && (first.contains(" s;") || first.contains(" ms;")),
        "{first}"
    );
    assert!(!stderr.contains("layers,"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

/// With a usable GPU, `--device gpu` decodes there; without one it is an error that names what
/// was probed and points at `--device cpu`.
#[test]
fn asking_for_the_gpu_runs_there_or_says_what_was_probed() {
    let model = tiny_model("gpu");
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(&model)
        .args(["-p", "x", "-n", "4", "--device", "gpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match hip_ffi::Platform::default_device() {
        Ok(_) => {
            assert!(out.status.success(), "{stderr}");
            assert!(stderr.contains("on gpu ("), "{stderr}");
            assert!(stderr.contains("outside the allocator"), "{stderr}");
        }
        Err(reason) => {
            assert!(!out.status.success());
            assert!(stderr.contains("no usable GPU"), "{stderr}");
            assert!(
                stderr.contains(&reason),
                "the probe's reason is missing: {stderr}"
            );
            assert!(stderr.contains("--device cpu"), "{stderr}");
        }
    }
    std::fs::remove_file(&model).ok();
}

#[test]
fn bad_input_is_reported_not_panicked() {
    let out = hipdecode()
        .args([
            "run",
            "-m",
            "/nonexistent/model.gguf",
            "-p",
            "x",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/nonexistent/model.gguf"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let model = tiny_model("temp");
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(&model)
        .args(["-p", "x", "--temp=-1", "--device", "cpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--temp"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

#[test]
fn inspect_reports_metadata_and_exports_a_tensor() {
    let model = tiny_model("inspect");
    let out = hipdecode().arg("inspect").arg(&model).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("general.architecture"), "{text}");
    let npy = common::scratch_dir().join(format!("cli-{}.npy", std::process::id()));
    let out = hipdecode()
        .arg("inspect")
        .arg(&model)
        .args(["--tensor", "output_norm.weight", "--npy"])
        .arg(&npy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (shape, data) = common::read_npy_f32(&npy);
    assert_eq!(shape.len(), 1);
    assert_eq!(data.len(), shape[0]);
    std::fs::remove_file(&npy).ok();
    std::fs::remove_file(&model).ok();
}

/// Lines of a Rust backtrace (as anyhow prints when an error is returned from `main`).
fn backtrace_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.starts_with("Stack backtrace")
                || t.starts_with("stack backtrace")
                || t.starts_with("at /")
                || t.split_once(": ")
                    .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .collect()
}

#[test]
fn a_user_error_prints_its_message_and_causes_without_a_backtrace() {
    // A model path that does not exist: a user error on every machine, GPU or not.
    let missing = common::scratch_dir().join("no-such-model.gguf");
    let out = hipdecode()
        .env("RUST_BACKTRACE", "1")
        .args(["run", "-m"])
        .arg(&missing)
        .args(["-p", "x", "--device", "cpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("no-such-model.gguf"), "{stderr}");
    assert_eq!(backtrace_lines(&stderr), Vec::<&str>::new(), "{stderr}");
}

#[test]
fn hipdecode_variables_are_checked_on_a_cpu_run_too() {
    let model = tiny_model("env");
    let run = |var: &str, value: &str| {
        hipdecode()
            .env(var, value)
            .args(["run", "-m"])
            .arg(&model)
            .args(["-p", "hi", "-n", "1", "--temp", "0", "--device", "cpu"])
            .output()
            .unwrap()
    };
    let out = run("HIPDECODE_CACHE_LIMIT", "abc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("HIPDECODE_CACHE_LIMIT"), "{stderr}");
    assert!(stderr.contains("\"abc\""), "{stderr}");
    assert!(stderr.contains("accepted forms"), "{stderr}");

    // A misspelt name is a warning naming the nearest known one; the run goes on.
    let out = run("HIPDECODE_CACHE_LIMT", "1G");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: HIPDECODE_CACHE_LIMT"), "{stderr}");
    assert!(
        stderr.contains("did you mean HIPDECODE_CACHE_LIMIT?") && stderr.contains("hipdecode env"),
        "{stderr}"
    );
    std::fs::remove_file(&model).ok();
}

/// `[P prompt tokens: R from the cache, C computed; A answer tokens, why]` lines of a chat.
fn turn_counts(stderr: &str) -> Vec<[usize; 4]> {
    stderr
        .lines()
        .filter(|l| l.contains("prompt tokens:"))
        .filter_map(|l| l.find('[').map(|i| &l[i + 1..]))
        .map(|l| {
            let n: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            [n[0], n[1], n[2], n[3]]
        })
        .collect()
}

/// `hipdecode chat` on `model` through SmolLM2's template, greedy on the CPU, every stream
/// piped.
fn chat_child(model: &std::path::Path, extra: &[&str]) -> std::process::Child {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../decode/tests/data/chat_templates/smollm2-135m-instruct.jinja"
    );
    hipdecode()
        .args(["chat", "-m"])
        .arg(model)
        .args([
            "--chat-template",
            template,
            "--device",
            "cpu",
            "--temp",
            "0",
        ])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn chat(model: &std::path::Path, extra: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = chat_child(model, extra);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn chat_computes_only_what_follows_the_cached_conversation() {
    let model = tiny_model("chat");
    let out = chat(&model, &["-n", "6"], "hello there\nand again\nthird one\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let turns = turn_counts(&stderr);
    assert_eq!(turns.len(), 3, "{stderr}");
    // The first turn computes its whole prompt.
    assert_eq!(turns[0][1], 0, "{stderr}");
    assert_eq!(turns[0][2], turns[0][0], "{stderr}");
    for w in turns.windows(2) {
        let ([prompt, _, _, answer], [next, reused, computed, _]) = (w[0], w[1]);
        // The cache holds the last prompt and the answer but its last token (sampled, never
        // fed). The next prompt begins with the last one (but where its last token merges with
        // what follows), so at least that much is reused; where the answer's text tokenizes
        // as it was generated, all of it is.
        assert!(reused + 1 >= prompt && reused < prompt + answer, "{stderr}");
        assert_eq!(reused + computed, next, "{stderr}");
    }
    std::fs::remove_file(&model).ok();
}

#[test]
fn chat_says_when_a_message_does_not_fit_and_goes_on() {
    let model = tiny_model("chat-long");
    let long = "word ".repeat(200);
    let out = chat(
        &model,
        &["-n", "4", "--ctx", "128"],
        &format!("{long}\nshort\n"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("more than the 128") && stderr.contains("/reset"),
        "{stderr}"
    );
    // The short message after it is answered, from an empty conversation.
    let turns = turn_counts(&stderr);
    assert_eq!(turns.len(), 1, "{stderr}");
    assert_eq!(turns[0][1], 0, "{stderr}");
    std::fs::remove_file(&model).ok();
}

#[test]
fn chat_without_a_template_says_so_before_loading() {
    let model = tiny_model("chat-none");
    let out = hipdecode()
        .args(["chat", "-m"])
        .arg(&model)
        .args(["--device", "cpu"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no chat template") && stderr.contains("--chat-template"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

#[test]
fn a_sampled_run_prints_its_random_seed_and_the_seed_repeats_it() {
    let model = tiny_model("seed");
    let run = |extra: &[&str]| {
        hipdecode()
            .args(["run", "-m"])
            .arg(&model)
            .args([
                "-p", "hello", "-n", "12", "--temp", "1.0", "--device", "cpu",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let first = run(&[]);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    let seed = stderr
        .lines()
        .find_map(|l| l.strip_prefix("sampling seed "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no seed printed: {stderr}"))
        .to_string();
    let again = run(&["--seed", &seed]);
    assert!(again.status.success());
    assert_eq!(
        first.stdout, again.stdout,
        "the printed seed repeats the run"
    );
    assert!(!String::from_utf8_lossy(&again.stderr).contains("sampling seed"));
    std::fs::remove_file(&model).ok();
}

#[test]
fn a_template_that_renders_nothing_is_an_error_and_the_chat_goes_on() {
    let model = tiny_model("chat-empty");
    let empty = common::scratch_dir().join(format!("empty-{}.jinja", std::process::id()));
    std::fs::write(&empty, "{# nothing #}").unwrap();
    let out = hipdecode()
        .args(["chat", "-m"])
        .arg(&model)
        .arg("--chat-template")
        .arg(&empty)
        .args(["--device", "cpu", "--temp", "0", "-n", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"hi\nagain\n")?;
            child.wait_with_output()
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("rendered to no tokens").count(),
        2,
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_file(&model).ok();
    std::fs::remove_file(&empty).ok();
}

#[test]
fn a_stop_string_ends_the_text_before_it_in_run_and_chat() {
    let model = tiny_model("stop");
    // Greedy continuations of the tiny model, without and with a stop string drawn from the
    // first: the stop string's text and what follows are never printed.
    let run = |extra: &[&str]| {
        let out = hipdecode()
            .args(["run", "-m"])
            .arg(&model)
            .args([
                "-p",
                "hello world",
                "-n",
                "12",
                "--temp",
                "0",
                "--device",
                "cpu",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success());
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (full, _) = run(&[]);
    let continuation = full
        .trim_end_matches('\n')
        .strip_prefix("hello world")
        .unwrap();
    let chars: Vec<char> = continuation.chars().collect();
    assert!(chars.len() >= 6, "{continuation:?}");
    // A stop string that begins at the continuation's third character.
    let stop: String = chars[2..5].iter().collect();
    let at = continuation.find(&stop).unwrap();
    let (stopped, stderr) = run(&["--stop", &stop]);
    assert_eq!(
        stopped,
        format!("hello world{}\n", &continuation[..at]),
        "stop {stop:?}"
    );
    assert!(stderr.contains("stopped at stop string"), "{stderr}");
    // The chat leaves it out of the answer too.
    let out = chat(&model, &["-n", "12", "--stop", &stop], "hi\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("stop string]") || stderr.contains("token limit]"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&stop),
        "{stderr}"
    );
    std::fs::remove_file(&model).ok();
}

#[test]
fn ctrl_c_stops_the_answer_and_the_chat_goes_on() {
    use std::io::{Read, Write};
    let model = tiny_model("interrupt");
    // An answer far longer than the time to interrupt it.
    let mut child = chat_child(&model, &["-n", "1000000", "--ctx", "100000"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"tell me everything\n").unwrap();
    // Once the answer streams, Ctrl-C.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("the answer starts");
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    // The program is still there for the next message, and ends on /exit.
    stdin.write_all(b"and now?\n/exit\n").unwrap();
    drop(stdin);
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        stdout.read_to_end(&mut rest).map(|_| rest)
    });
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let turns: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("prompt tokens:"))
        .collect();
    assert_eq!(turns.len(), 2, "{stderr}");
    assert!(turns[0].ends_with("interrupted]"), "{}", turns[0]);
    std::fs::remove_file(&model).ok();
}

/// `hipdecode profile -b 3` times decode steps of three rows on the GPU (and names them in its
/// header); without a GPU it says so. `-b 0` is refused before anything loads.
#[test]
fn profile_times_steps_of_several_sequences_on_the_gpu() {
    let model = tiny_model("profile");
    let out = hipdecode()
        .args(["profile", "-m"])
        .arg(&model)
        .args(["-b", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--sequences must be at least 1"),
        "{stderr}"
    );

    let out = hipdecode()
        .args(["profile", "-m"])
        .arg(&model)
        .args(["-b", "3", "-p", "5", "-n", "2"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    match hip_ffi::Platform::default_device() {
        Ok(_) => {
            assert!(out.status.success(), "{stderr}");
            assert!(stdout.contains("2 decode steps of 3 rows"), "{stdout}");
            assert!(stdout.contains("per-op profile: 2 steps"), "{stdout}");
            assert!(stdout.contains("attention decode"), "{stdout}");
        }
        Err(_) => {
            assert!(!out.status.success());
            assert!(stderr.contains("no usable GPU"), "{stderr}");
        }
    }
    std::fs::remove_file(&model).ok();
}

/// `hipdecode run -m MODEL --device cpu ARGS`: its status code, stdout and stderr.
fn run_on_cpu(model: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(model)
        .args(["--device", "cpu"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A file with a tensor of a type hipdecode cannot read: `inspect` shows it all, the tensor
/// listed apart with its type; `run` refuses it, naming the tensor and the type.
#[test]
fn inspect_shows_a_file_with_an_unreadable_tensor_and_run_names_it() {
    let model = tiny_model("unreadable");
    let mut bytes = std::fs::read(&model).unwrap();
    test_support::models::set_tensor_type(&mut bytes, "output_norm.weight", 16);
    std::fs::write(&model, &bytes).unwrap();
    let out = hipdecode().arg("inspect").arg(&model).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("cannot read") && stdout.contains("IQ2_XXS (id 16)"),
        "{stdout}"
    );
    assert!(stdout.contains("output_norm.weight"), "{stdout}");
    let (code, _, stderr) = run_on_cpu(&model, &["-p", "x"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("IQ2_XXS") && stderr.contains("output_norm.weight"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

/// `-n 0` still processes the prompt: its speed is measured (not a token count over no time),
/// and a prompt longer than the context is an error whatever `-n` is.
#[test]
fn run_with_no_new_tokens_prefills_and_checks_the_context() {
    let model = tiny_model("n0");
    let (code, _, stderr) = run_on_cpu(&model, &["-p", "hello world, hello world", "-n", "0"]);
    assert_eq!(code, Some(0), "{stderr}");
    let speed: f64 = stderr
        .split("tokens at ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no prefill speed: {stderr}"));
    // Skipping the prefill reported about 1e9 tok/s (the token count over a nanosecond).
    assert!(
        speed > 0.0 && speed < 1e8,
        "prefill speed {speed}: {stderr}"
    );
    assert!(stderr.contains("generated 0 tokens"), "{stderr}");

    let long = "word ".repeat(64);
    let (code, _, stderr) = run_on_cpu(&model, &["-p", &long, "-n", "0", "--ctx", "16"]);
    assert_eq!(code, Some(1), "a 64-word prompt in 16 positions: {stderr}");
    assert!(stderr.contains("the context is full"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

/// llama.cpp's common flags mean the same here (`-c`, `--ctx-size`, `-t`, `-s`, `-f`); its
/// layer flags are refused with the budget to use instead; values that start with a dash are
/// values (a prompt, a negative temperature that is then refused by its range).
#[test]
fn llama_cpp_habits_work_or_explain_themselves() {
    let model = tiny_model("habits");
    let prompt = common::scratch_dir().join(format!("prompt-{}.txt", std::process::id()));
    std::fs::write(&prompt, "hello world").unwrap();
    let run = |extra: &[&str]| run_on_cpu(&model, extra);
    let f = prompt.to_str().unwrap();
    let (code, stdout, stderr) = run(&["-f", f, "-c", "32", "-s", "7", "-t", "1", "-n", "3"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("hello world"), "{stdout}");
    assert!(stderr.contains("context 32"), "{stderr}");
    let (_, again, _) = run(&["-f", f, "--ctx-size", "32", "--seed", "7", "-n", "3"]);
    assert_eq!(again, stdout, "the same seed, the same tokens");
    let (code, stdout, stderr) = run(&["-p", "-5 degrees", "-n", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("-5 degrees"), "{stdout}");
    let (code, _, stderr) = run(&["-p", "x", "--temp", "-1"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("--temp must be a finite number >= 0"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["-p", "x", "-ngl", "99"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("-ngl is llama.cpp's") && stderr.contains("--gpu-budget"),
        "{stderr}"
    );
    std::fs::remove_file(&prompt).ok();
    std::fs::remove_file(&model).ok();
}

/// llama.cpp's `-ctk` / `-ctv` (and the long spellings) set the KV cache's type, shown in the
/// run's report; an unknown type, q4_0 (not yet supported), two different types and the
/// retired `HIPDECODE_KV_TYPE` are each refused with the fix.
#[test]
fn kv_cache_types_are_flags_as_in_llama_cpp_and_the_old_variable_is_refused() {
    let model = tiny_model("ctk");
    for flags in [
        &["-ctk", "q8_0"][..],
        &["-ctv", "q8_0"],
        &["--cache-type-k=q8_0", "--cache-type-v", "q8_0"],
    ] {
        let mut args = vec!["-p", "hello world", "-n", "3", "--temp", "0"];
        args.extend(flags);
        let (code, stdout, stderr) = run_on_cpu(&model, &args);
        assert_eq!(code, Some(0), "{flags:?}: {stderr}");
        assert!(stdout.starts_with("hello world"), "{stdout}");
        assert!(
            stderr.contains("q8_0"),
            "{flags:?} names no q8_0 KV: {stderr}"
        );
    }
    let refused = |args: &[&str], needles: &[&str]| {
        let (code, _, stderr) = run_on_cpu(&model, args);
        assert_ne!(code, Some(0), "{args:?} ran: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{args:?}: no '{needle}' in {stderr}"
            );
        }
    };
    refused(
        &["-p", "x", "-ctk", "q9"],
        &["'q9' is not a KV cache type", "q8_0"],
    );
    refused(
        &["-p", "x", "-ctk", "q4_0"],
        &["q4_0 is not supported", "f16"],
    );
    refused(
        &["-p", "x", "-ctk", "q8_0", "-ctv", "f16"],
        &["differ", "-ctk q8_0 -ctv q8_0"],
    );
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(&model)
        .args(["--device", "cpu", "-p", "x", "-n", "1"])
        .env("HIPDECODE_KV_TYPE", "f32")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the retired variable was taken: {stderr}"
    );
    assert!(
        stderr.contains("HIPDECODE_KV_TYPE") && stderr.contains("-ctk"),
        "{stderr}"
    );
    std::fs::remove_file(&model).ok();
}

/// Standard output that goes away: a reader that closes the pipe after a few bytes ends the run
/// quietly with SIGPIPE's status (141, as coreutils end), and a full device (`/dev/full`) is an
/// error naming standard output with status 1. Rust's `print!` panicked with status 101 in both.
#[test]
fn a_closed_pipe_or_a_full_disk_ends_the_run_as_command_line_tools_end() {
    use std::io::Read;
    let model = tiny_model("stdout");
    let run = |stdout: std::process::Stdio| {
        hipdecode()
            .args(["run", "-m"])
            .arg(&model)
            .args(["--device", "cpu", "-p", "Once upon a time", "-n", "400"])
            .args(["--temp", "0"])
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = run(std::process::Stdio::piped());
    let mut first = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here: the run's next write meets a closed pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = run(full.into()).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("writing to standard output") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// Log events reach standard error: `-v` shows the model load's info event, `RUST_LOG` picks
/// the level itself, and neither given shows none (warnings only).
#[test]
fn verbose_and_rust_log_show_the_libraries_events() {
    let model = tiny_model("logging");
    let run = |verbose: bool, rust_log: Option<&str>| {
        let mut cmd = hipdecode();
        if verbose {
            cmd.arg("-v");
        }
        cmd.args(["run", "-m"])
            .arg(&model)
            .args(["--device", "cpu", "-p", "Hi", "-n", "1"])
            .env_remove("RUST_LOG");
        if let Some(level) = rust_log {
            cmd.env("RUST_LOG", level);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let loaded = |stderr: &str| {
        stderr
            .lines()
            .any(|l| l.contains("INFO") && l.contains("loaded"))
    };
    assert!(!loaded(&run(false, None)));
    assert!(loaded(&run(true, None)));
    assert!(loaded(&run(false, Some("debug"))));
    assert!(!loaded(&run(true, Some("error"))));
}

/// A context whose KV cache cannot fit the host's available memory is refused before anything
/// is allocated, naming the bytes, the limit and the fix. Before, the CPU backend took the
/// allocation lazily (a 57.5 GiB cache on a 23 GiB machine) and ran on towards the OOM killer.
#[test]
fn a_context_larger_than_the_host_can_hold_is_refused_with_the_bytes() {
    let model = tiny_model("huge-context");
    let mut bytes = std::fs::read(&model).unwrap();
    // The tiny model trained for 4 billion positions, so --ctx is not clamped to 2048.
    test_support::models::set_u32_metadata(&mut bytes, "qwen3.context_length", u32::MAX);
    std::fs::write(&model, &bytes).unwrap();
    let (status, _, stderr) = run_on_cpu(&model, &["-p", "Hi", "-n", "1", "--ctx", "4000000000"]);
    assert_eq!(status, Some(1), "{stderr}");
    for word in [
        "4000000000 positions",
        "KV cache",
        "available on the host",
        "--ctx",
    ] {
        assert!(stderr.contains(word), "{word} missing: {stderr}");
    }
    // A context that fits still runs.
    let (status, _, stderr) = run_on_cpu(&model, &["-p", "Hi", "-n", "1", "--ctx", "64"]);
    assert_eq!(status, Some(0), "{stderr}");
}

/// A model whose embedding of the first token it generates for `text` is NaN (a corrupt
/// file): the tiny Qwen3 of `tiny_model`, its output projection apart from the embedding, so
/// the prompt runs clean and the first token comes out. The path and that token.
fn nan_after_first_token(tag: &str, text: &str) -> (std::path::PathBuf, u32) {
    use decode::backend::cpu::CpuBackend;
    let model = tiny_model(tag);
    let file = decode::open_model(&model).unwrap();
    let tokenizer = decode::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let prompt = tokenizer.encode(text, tokenizer.vocab().add_bos);
    let backend = CpuBackend::new(decode::backend::Precision::Fast);
    let options = decode::context::ContextOptions::default();
    let mut session = decode::session::Session::load(&file, backend, options).unwrap();
    let greedy = decode::sampler::SamplerConfig::GREEDY;
    let first = session.prefill_and_sample(&prompt, &greedy).unwrap();
    assert!(!prompt.contains(&first), "{text:?} holds its continuation");
    drop((session, file));
    let mut bytes = std::fs::read(&model).unwrap();
    test_support::models::set_non_finite_row(
        &mut bytes,
        "token_embd.weight",
        first as usize,
        f32::NAN,
    );
    std::fs::write(&model, &bytes).unwrap();
    (model, first)
}

/// NaN weights end the run with an error that names the position and the tensor, not with
/// an empty continuation and exit 0.
#[test]
fn a_nan_in_the_weights_ends_the_run_with_an_error_naming_the_tensor() {
    let text = "hello world";
    let (model, _) = nan_after_first_token("nan", text);
    let file = decode::open_model(&model).unwrap();
    let tokenizer = decode::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let n_prompt = tokenizer.encode(text, tokenizer.vocab().add_bos).len();
    // Greedy, the first decode step reads the NaN row; sampled, the step after the token is
    // drawn, wherever that is.
    let greedy_at = format!("the logits are not finite at position {n_prompt} ");
    let runs = [
        (["--temp", "0"], greedy_at.as_str()),
        (["--temp", "0.7"], "the logits are not finite at position "),
    ];
    for (args, what) in runs {
        let (code, stdout, stderr) = run_on_cpu(
            &model,
            &[&["-p", text, "-n", "64", "--seed", "3"][..], &args].concat(),
        );
        assert_eq!(code, Some(1), "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(what)
                && stderr.contains("first non-finite output at tensor token_embd.weight")
                && stderr.contains("re-download or re-convert the model"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stdout.starts_with(text), "{stdout}");
    }
    std::fs::remove_file(&model).ok();
}

/// `--json-stats` ends stderr with one JSON line: speeds, the per-tag memory, and under
/// "device" the GPU allocator's reserved, cached and peak bytes and the bytes outside it
/// (null on the CPU, which has no allocator of its own).
#[test]
fn json_stats_carry_the_allocators_figures() {
    let model = tiny_model("json-stats");
    let last_json = |stderr: &str| -> serde_json::Value {
        let line = stderr.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}\n{stderr}"))
    };
    let (code, _, stderr) = run_on_cpu(&model, &["-p", "hello", "-n", "3", "--json-stats"]);
    assert_eq!(code, Some(0), "{stderr}");
    let stats = last_json(&stderr);
    assert_eq!(stats["generated_tokens"], 3, "{stats}");
    assert!(
        stats["memory"]["total"].as_u64().unwrap_or(0) > 0,
        "{stats}"
    );
    assert!(stats["device"].is_null(), "{stats}");

    if hip_ffi::Platform::default_device().is_err() {
        eprintln!("json_stats_carry_the_allocators_figures: no GPU, the device half is skipped");
        return;
    }
    let out = hipdecode()
        .args(["run", "-m"])
        .arg(&model)
        .args(["--device", "gpu", "-p", "hello", "-n", "3", "--json-stats"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let device = &last_json(&stderr)["device"];
    let field = |k: &str| {
        device[k]
            .as_u64()
            .unwrap_or_else(|| panic!("device.{k} missing: {device}"))
    };
    assert!(field("reserved") > 0, "{device}");
    assert!(field("peak_reserved") >= field("reserved"), "{device}");
    assert!(field("cached") <= field("reserved"), "{device}");
    assert!(field("process_used") >= field("reserved"), "{device}");
    assert!(
        field("process_used") - field("reserved") == field("outside_allocator"),
        "{device}"
    );
    std::fs::remove_file(&model).ok();
}

/// `run --tp 2` on the CPU splits the model over two ranks and writes the same greedy text as
/// the whole model; a split the shape refuses, or one on the GPU, says why.
#[test]
fn run_split_over_two_ranks_writes_what_one_rank_writes() {
    use decode::gguf_loader::GgmlType;
    // Q8_0 weights: the tiny shape's Q4_K rows of 256 cannot be cut in two.
    let model = common::scratch_dir().join(format!("cli-tp-{}.gguf", std::process::id()));
    std::fs::write(
        &model,
        common::preset_with_weights_as(Preset::TinyQwen3, GgmlType::Q8_0),
    )
    .unwrap();
    let args = ["-p", "hello world", "-n", "8", "--temp", "0", "--exact"];
    let (code, whole, stderr) = run_on_cpu(&model, &args);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, split, stderr) = run_on_cpu(&model, &[&args[..], &["--tp", "2"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(split, whole);
    assert!(stderr.contains("split over 2 CPU ranks"), "{stderr}");
    assert!(
        stderr.contains("rank 1:") && stderr.contains("kv_cache"),
        "{stderr}"
    );
    let (code, _, stderr) = run_on_cpu(&model, &[&args[..], &["--tp", "3"]].concat());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cannot be split over 3 ranks"), "{stderr}");
    std::fs::remove_file(&model).ok();
}
