//! `hipdecode serve` end to end on the CPU with SmolLM2-135M-Instruct (its ChatML template):
//! a load of concurrent streams in a KV budget of four sequences against each request run
//! alone (both on the exact path), the shutdown on SIGTERM, deadlines, the prefix cache across turns, the API key, and
//! hostile requests, each refused with a 4xx while the server goes on.

mod server;

use decode::chat::encode_rendered;
use decode::chat_template::{ChatTemplate, Conversation};
use decode::context::ContextOptions;
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::tokenizer::{TextStream, Tokenizer};
use serde_json::{json, Value};
use server::{one_at_a_time, ServerProc, SseEvent};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";

/// Positions per sequence in these servers.
const CTX: usize = 128;

fn chat_body(user: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    })
}

/// The prompt tokens the server makes of one user message.
fn prompt_tokens(file: &decode::GgufFile, tokenizer: &Tokenizer, user: &str) -> Vec<u32> {
    let template = ChatTemplate::from_gguf(file, tokenizer, "smollm2").expect("its template");
    let text = template
        .render(&Conversation {
            messages: vec![json!({"role": "user", "content": user})],
            tools: None,
            add_generation_prompt: true,
        })
        .expect("renders");
    encode_rendered(&template, tokenizer, &text)
}

/// What one request gives run alone on a session of its own, greedy, every token shown but
/// the end-of-generation ones (as the server shows them). On the fast path, as the server
/// runs: the exact path took over eight minutes for these sixteen requests on two cores, and
/// a fast-path row is quantized on its own, so a batch's rows must still give each request's
/// tokens alone.
/// Each prompt's greedy text run alone on a session of the CPU's exact path (f32 activations),
/// which is what a server started with `--exact` runs: its rows then depend on nothing else in
/// the step.
fn alone(model: &Path, prompts: &[Vec<u32>], max_new: usize) -> Vec<String> {
    let file = decode::open_model(model).expect("opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let backend = decode::backend::cpu::CpuBackend::new(decode::backend::Precision::Exact);
    let options = ContextOptions {
        context: CTX,
        ..ContextOptions::default()
    };
    let mut session = Session::load(&file, backend, options).expect("loads");
    prompts
        .iter()
        .map(|prompt| {
            session.reset();
            let mut text = TextStream::new(&tokenizer);
            let mut out = String::new();
            decode::generate::generate(
                &mut session,
                prompt,
                max_new,
                SamplerConfig::GREEDY,
                &|_| false,
                &mut |t| {
                    if !tokenizer.is_stop(t) {
                        out.push_str(&text.push(t));
                    }
                },
            )
            .expect("generates");
            out.push_str(&text.finish());
            out
        })
        .collect()
}

/// Sets its flag when dropped, on a normal return or while unwinding from a panic.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn sixteen_streams_in_a_budget_of_four_sequences_equal_each_request_alone() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let _one = one_at_a_time();
    let file = decode::open_model(&model).expect("opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let spec = decode::model::ModelSpec::from_gguf(&file).expect("spec");
    const STREAMS: usize = 16;
    const TOKENS: usize = 32;
    let users: Vec<String> = (0..STREAMS)
        .map(|i| format!("Write one sentence about the number {}.", 3 * i + 1))
        .collect();
    let prompts: Vec<Vec<u32>> = (users.iter())
        .map(|u| prompt_tokens(&file, &tokenizer, u))
        .collect();
    let expected = alone(&model, &prompts, TOKENS);

    // Four whole sequences of KV (f32 on the CPU, either path); more sequences than that may run while
    // their prompts fit, and the scheduler preempts when they grow.
    let block = decode::layout::context::pool_block_bytes(&spec, CTX, 64, decode::kv::KvType::F32)
        .expect("block");
    let budget_blocks = 4 * CTX / decode::kv::block_positions();
    let budget = (budget_blocks as u64 * block).to_string();
    let ctx = CTX.to_string();
    let mut srv = ServerProc::start(
        &model,
        &[
            "--device",
            "cpu",
            "--exact",
            "--ctx",
            &ctx,
            "--parallel",
            "8",
            "--kv-budget",
            &budget,
            "--max-queue",
            "32",
            "--shutdown-timeout",
            "3",
        ],
    );
    let srv_ref = &srv;

    // Probes all through the load: /health every 100 ms, /metrics every 250 ms.
    let stop = AtomicBool::new(false);
    let slowest_health = AtomicU64::new(0);
    let most_used = AtomicU64::new(0);
    let metrics_seen = Mutex::new(String::new());
    let results = std::thread::scope(|s| {
        // A failed assertion below unwinds out of this closure; the probes must stop then too,
        // or the scope would wait for them forever and the failure would read as a hang.
        let _stop_probes = StopOnDrop(&stop);
        s.spawn(|| {
            let a = server::agent(Duration::from_secs(5));
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let r = a
                    .get(srv_ref.url("/health"))
                    .call()
                    .expect("health answers");
                assert_eq!(r.status().as_u16(), 200);
                slowest_health.fetch_max(t.elapsed().as_millis() as u64, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let (status, text) = srv_ref.get("/metrics");
                assert_eq!(status, 200);
                let used = ServerProc::metric(&text, "hipdecode_kv_blocks{state=\"used\"}");
                let used = used.unwrap_or(0.0);
                assert!(used <= budget_blocks as f64, "{used} blocks used:\n{text}");
                most_used.fetch_max(used as u64, Ordering::SeqCst);
                if used > 0.0 {
                    *metrics_seen.lock().unwrap() = text;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        // Four clients that leave after two pieces, streaming or not.
        let leavers: Vec<_> = (0..4)
            .map(|i| {
                s.spawn(move || {
                    let body = chat_body(&format!("Tell me a long story number {i}."), 64, true);
                    let mut stream = srv_ref.stream(CHAT, &body);
                    assert_eq!(stream.status, 200);
                    stream.read_content(2);
                })
            })
            .collect();
        let streams: Vec<_> = (0..STREAMS)
            .map(|i| {
                let body = chat_body(&users[i], TOKENS, true);
                s.spawn(move || srv_ref.stream(CHAT, &body).finish())
            })
            .collect();
        for l in leavers {
            l.join().expect("a leaving client");
        }
        let results: Vec<_> = streams.into_iter().map(|t| t.join().unwrap()).collect();
        // Every sequence's blocks come back once the streams are over (the cached prefix
        // blocks are counted apart).
        let t = Instant::now();
        loop {
            let (_, text) = srv_ref.get("/metrics");
            let used = ServerProc::metric(&text, "hipdecode_kv_blocks{state=\"used\"}");
            let running = ServerProc::metric(&text, "hipdecode_requests_running");
            if used == Some(0.0) && running == Some(0.0) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "blocks still held:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::SeqCst);
        results
    });
    for (i, r) in results.iter().enumerate() {
        assert!(r.done && r.error.is_none(), "stream {i}: {r:?}");
        assert_eq!(r.finish_reason.as_deref(), Some("length"), "stream {i}");
        assert_eq!(r.text, expected[i], "stream {i} against its request alone");
        let usage = r.usage.as_ref().expect("usage");
        assert_eq!(usage["completion_tokens"], TOKENS, "stream {i}");
        assert_eq!(usage["prompt_tokens"], prompts[i].len(), "stream {i}");
        let peak = usage["kv_peak_bytes"].as_u64().unwrap();
        let blocks = (prompts[i].len() + TOKENS - 1).div_ceil(16) as u64;
        assert_eq!(peak, blocks * block, "stream {i}: its peak is its blocks");
    }
    let text = metrics_seen.lock().unwrap().clone();
    eprintln!("--- /metrics during the load ---\n{text}");
    assert!(
        most_used.load(Ordering::SeqCst) > 0,
        "no scrape saw blocks in use"
    );
    let slowest = slowest_health.load(Ordering::SeqCst);
    assert!(slowest < 1000, "a /health probe took {slowest} ms");
    let (_, text) = srv.get("/metrics");
    let gone = ServerProc::metric(&text, "hipdecode_requests_client_gone_total").unwrap_or(0.0);
    assert!(gone >= 4.0, "the leaving clients were cancelled:\n{text}");

    // SIGTERM while streams run: new requests get 503, the running ones end with a finish
    // reason and [DONE] (cut at the 3 s shutdown timeout), and the process exits 0.
    let pid = srv.pid();
    let running: Vec<_> = (0..2)
        .map(|i| {
            let body = chat_body(&format!("Count slowly to one hundred, take {i}."), 64, true);
            let mut stream = srv.stream(CHAT, &body);
            assert_eq!(stream.status, 200);
            assert_eq!(stream.read_content(1).pieces, 1);
            std::thread::spawn(move || stream.finish())
        })
        .collect();
    let t = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = srv.post(CHAT, chat_body("hello", 4, false).to_string().as_bytes());
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    for r in running {
        let r = r.join().unwrap();
        assert!(r.done && r.error.is_none(), "{r:?}");
        assert_eq!(r.finish_reason.as_deref(), Some("length"), "{r:?}");
    }
    let status = srv.wait(Duration::from_secs(20));
    assert!(status.success(), "exit {status:?}:\n{}", srv.log());
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn deadlines_and_a_conversation_that_goes_on_from_the_prefix_cache() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let _one = one_at_a_time();
    let file = decode::open_model(&model).expect("opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let srv = ServerProc::start(
        &model,
        &[
            "--device",
            "cpu",
            "--ctx",
            "2048",
            "--parallel",
            "1",
            "--timeout",
            "60",
            "--max-queue",
            "1",
        ],
    );

    // A running request at its deadline (6 s) ends with what it has, "length"; one queued
    // behind it all through its own deadline (1 s) gets 503. Both are shorter than the
    // server's --timeout, which bounds them. The long one asks for more tokens than any
    // CPU makes in 6 s (1,800 at ~300 tok/s), and ignores the end of text.
    let mut long = chat_body("Count from one to one thousand.", 1800, false);
    long["timeout"] = json!(6.0);
    long["ignore_eos"] = json!(true);
    let mut queued = chat_body("hi", 4, false);
    queued["timeout"] = json!(1.0);
    let (first, second) = std::thread::scope(|s| {
        let a = s.spawn(|| srv.post(CHAT, long.to_string().as_bytes()));
        std::thread::sleep(Duration::from_millis(300));
        let b = s.spawn(|| srv.post(CHAT, queued.to_string().as_bytes()));
        // One running and one queued fill --max-queue 1: one more is refused at once.
        std::thread::sleep(Duration::from_millis(300));
        let (status, text) = srv.post(CHAT, chat_body("hi", 4, false).to_string().as_bytes());
        assert_eq!(status, 503, "{text}");
        assert!(
            text.contains("queue_full") && text.contains("--max-queue"),
            "{text}"
        );
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(first.0, 200, "{}", first.1);
    let first: Value = serde_json::from_str(&first.1).unwrap();
    assert_eq!(first["choices"][0]["finish_reason"], "length");
    let got = first["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(got > 0 && got < 1800, "{got} tokens in 6 s");
    assert_eq!(second.0, 503, "{}", second.1);
    assert!(second.1.contains("queue_timeout"), "{}", second.1);

    // A finished conversation plus one turn: everything before the new turn is found in the
    // prefix cache (whole blocks of 16), the answer's tokens too, not only the first prompt's.
    let question = "Describe the colour blue in five sentences.";
    let turn1 = json!([{"role": "user", "content": question}]);
    let body = json!({"messages": turn1, "max_tokens": 48, "temperature": 0});
    let (status, text) = srv.post(CHAT, body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let reply = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let messages = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And another one?"},
    ]);
    let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0});
    let (status, text) = srv.post(CHAT, body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let second: Value = serde_json::from_str(&text).unwrap();
    // What the first request's sequence held: its prompt and every answer token but the
    // last (sampled, never fed back).
    let template = ChatTemplate::from_gguf(&file, &tokenizer, "smollm2").unwrap();
    let render = |m: &Value| {
        let text = template
            .render(&Conversation {
                messages: m.as_array().unwrap().clone(),
                tools: None,
                add_generation_prompt: true,
            })
            .unwrap();
        encode_rendered(&template, &tokenizer, &text)
    };
    let first_prompt = render(&turn1);
    let second_prompt = render(&messages);
    let held =
        first_prompt.len() + answer["usage"]["completion_tokens"].as_u64().unwrap() as usize - 1;
    let mut fed = first_prompt.clone();
    fed.extend(tokenizer.encode(&reply, false));
    let common = (fed.iter().zip(&second_prompt))
        .take_while(|(a, b)| a == b)
        .count()
        .min(held)
        .min(second_prompt.len() - 1);
    let expected = common / 16 * 16;
    assert!(
        expected >= first_prompt.len().div_ceil(16) * 16 + 16,
        "the test needs an answer that fills blocks past the prompt ({common} shared)"
    );
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"], expected,
        "{second}"
    );
    assert_eq!(second["usage"]["prompt_tokens"], second_prompt.len());
}

#[test]
fn the_key_guards_the_api_and_the_metrics_but_not_health() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let _one = one_at_a_time();
    let srv = ServerProc::start(
        &model,
        &["--device", "cpu", "--api-key", "sesame", "--ctx", "64"],
    );
    let body = chat_body("hi", 2, false).to_string();
    let (status, text) = srv.post(CHAT, body.as_bytes());
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("authentication_error"), "{text}");
    let wrong = [("Authorization", "Bearer open")];
    assert_eq!(srv.post_with(CHAT, body.as_bytes(), &wrong).0, 401);
    assert_eq!(srv.get("/metrics").0, 401);
    assert_eq!(srv.get("/v1/models").0, 401);
    assert_eq!(srv.get("/health").0, 200);
    let key = [("Authorization", "Bearer sesame")];
    let (status, text) = srv.post_with(CHAT, body.as_bytes(), &key);
    assert_eq!(status, 200, "{text}");
    let (status, text) = srv.get_with("/v1/models", &key);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["context_length"], 64);
    assert_eq!(srv.get_with("/metrics", &key).0, 200);
    drop(srv);

    // The same key from a file, so it never shows in the command line.
    let file = test_support::models::scratch_dir("serve-tests")
        .join(format!("api-key-{}", std::process::id()));
    std::fs::write(&file, "sesame\n").unwrap();
    let srv = ServerProc::start(
        &model,
        &[
            "--device",
            "cpu",
            "--ctx",
            "64",
            "--api-key-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(srv.get("/v1/models").0, 401);
    assert_eq!(srv.get_with("/v1/models", &key).0, 200);
    std::fs::remove_file(&file).ok();
}

/// Each hostile request, its status, and a piece its message must hold.
#[test]
fn hostile_requests_get_a_4xx_that_names_the_problem_and_the_server_goes_on() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let _one = one_at_a_time();
    let srv = ServerProc::start(&model, &["--device", "cpu", "--ctx", "256"]);
    let digits = "7".repeat(100_000);
    let spaces = " ".repeat(100_000);
    let nested = "[".repeat(100_000) + &"]".repeat(100_000);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "huge max_tokens",
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000000}"#.to_vec(),
            400,
            "positions are left",
        ),
        (
            "NaN temperature",
            br#"{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}"#.to_vec(),
            400,
            "not valid JSON",
        ),
        (
            "temperature out of range",
            br#"{"messages":[{"role":"user","content":"hi"}],"temperature":1e308}"#.to_vec(),
            400,
            "temperature",
        ),
        (
            "invalid UTF-8",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}".to_vec(),
            400,
            "not valid JSON",
        ),
        ("deeply nested JSON", nested.into_bytes(), 400, "recursion"),
        (
            "100k digits",
            json!({"prompt": digits, "max_tokens": 1}).to_string().into_bytes(),
            400,
            "positions (--ctx)",
        ),
        (
            "100k spaces",
            json!({"prompt": spaces, "max_tokens": 1}).to_string().into_bytes(),
            400,
            "positions (--ctx)",
        ),
        (
            "tools",
            br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#.to_vec(),
            400,
            "`tools` is not supported",
        ),
        (
            "n = 3",
            br#"{"messages":[{"role":"user","content":"hi"}],"n":3}"#.to_vec(),
            400,
            "n = 3",
        ),
        ("not an object", b"[1, 2, 3]".to_vec(), 400, "JSON object"),
        ("an empty body", Vec::new(), 400, "not valid JSON"),
    ];
    let mut log = String::new();
    for (what, body, status, needle) in &cases {
        let path = if what.starts_with("100k") {
            "/v1/completions"
        } else {
            CHAT
        };
        let t = Instant::now();
        let (got, text) = srv.post(path, body);
        assert_eq!(got, *status, "{what}: {text}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{what}: {message}");
        // Not a timing test: a bound that only a hang (or a quadratic tokenizer) misses.
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what} took {:?}",
            t.elapsed()
        );
        log.push_str(&format!("{what}: {got} {message}\n"));
    }
    // 10 MB, sent as curl sends a large body (the server reads up to its limit, then
    // refuses).
    let (status, text, _) = srv.post_large("/v1/completions", 10 << 20, b' ');
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("--max-body"), "{text}");
    log.push_str(&format!("a 10 MB body: {status} {text}\n"));
    let (status, _) = srv.get("/no/such/route");
    assert_eq!(status, 404);
    let (status, _) = srv.get(CHAT);
    assert_eq!(status, 405);
    eprintln!("--- hostile requests and their answers ---\n{log}");
    // Still serving.
    let (status, text) = srv.post(CHAT, chat_body("hi", 2, false).to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let mut stream = srv.stream(CHAT, &chat_body("hi", 2, true));
    assert!(matches!(stream.next_event(), Some(SseEvent::Json(_))));
}

#[test]
fn the_openai_python_client_gets_what_hipdecode_run_gives() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let has_client = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_client {
        test_support::models::skip_unless_required::<()>(
            "python3 with the openai package is not installed (pip install -r tests/reference/requirements.txt)",
        );
        return;
    }
    let _one = one_at_a_time();
    let srv = ServerProc::start(
        &model,
        &["--device", "cpu", "--ctx", "256", "--api-key", "k"],
    );
    let script = test_support::models::workspace_root().join("tests/reference/openai_client.py");
    const QUESTION: &str = "What is the capital of France?";
    const TOKENS: usize = 24;
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(["--base-url", &srv.url("/v1"), "--api-key", "k"])
        .args(["--question", QUESTION, "--max-tokens", &TOKENS.to_string()])
        .output()
        .expect("run the client");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        srv.log()
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
    // `hipdecode run` on the prompt the template renders, the same settings.
    let file = decode::open_model(&model).expect("opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file, &tokenizer, "smollm2").unwrap();
    let rendered = template
        .render(&Conversation {
            messages: vec![json!({"role": "user", "content": QUESTION})],
            tools: None,
            add_generation_prompt: true,
        })
        .unwrap();
    assert!(
        rendered.starts_with(template.bos_token()),
        "the template writes the BOS"
    );
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_hipdecode"))
        .args([
            "run", "--device", "cpu", "--ctx", "256", "--temp", "0", "--no-bos",
        ])
        .arg("-m")
        .arg(&model)
        .args(["-p", &rendered, "-n", &TOKENS.to_string()])
        .output()
        .expect("hipdecode run");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let printed = String::from_utf8(run.stdout).unwrap();
    let continuation = printed
        .strip_prefix(&rendered)
        .expect("run prints the prompt first")
        .trim_end_matches('\n');
    assert!(!continuation.is_empty());
    assert_eq!(got["text"], continuation, "non-streaming: {got}");
    assert_eq!(got["streamed"], continuation, "streaming: {got}");
    assert_eq!(got["finish_reason"], got["streamed_finish_reason"]);
    assert!(got["prompt_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn impossible_settings_are_refused_at_start_with_the_fix() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let _one = one_at_a_time();
    let blank = test_support::models::scratch_dir("serve-tests")
        .join(format!("blank-key-{}", std::process::id()));
    std::fs::write(&blank, "  \nsecond line\n").unwrap();
    let blank = blank.to_str().unwrap().to_string();
    for (args, needle) in [
        (
            &["--api-key-file", "/nonexistent/key"][..],
            "--api-key-file /nonexistent/key: cannot read it",
        ),
        (
            &["--api-key-file", blank.as_str()][..],
            "its first line holds no key",
        ),
        (
            &["--parallel", "8", "--batch", "4"][..],
            "--batch 4 is smaller than --parallel 8",
        ),
        (&["--kv-budget", "1KiB"][..], "holds no KV block"),
        (&["--kv-budget", "lots"][..], "--kv-budget"),
        (
            &["--timeout", "0"][..],
            "--timeout must be a number of seconds > 0",
        ),
        (&["--max-body", "0"][..], "--max-body"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hipdecode"))
            .args(["serve", "--device", "cpu", "--port", "0", "-m"])
            .arg(&model)
            .args(args)
            .output()
            .expect("run hipdecode serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // The KV budget's variable, where --kv-budget is not given.
    for (value, needle) in [
        ("1KiB", "HIPDECODE_KV_BUDGET 1.0 KiB holds no KV block"),
        ("lots", "HIPDECODE_KV_BUDGET"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hipdecode"))
            .args(["serve", "--device", "cpu", "--port", "0", "-m"])
            .arg(&model)
            .env("HIPDECODE_KV_BUDGET", value)
            .output()
            .expect("run hipdecode serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(err.contains(needle), "{value}: {err}");
    }
    // Two keys are a usage error (clap's status 2).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hipdecode"))
        .args(["serve", "--device", "cpu", "--port", "0", "-m"])
        .arg(&model)
        .args(["--api-key", "k", "--api-key-file", blank.as_str()])
        .output()
        .expect("run hipdecode serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    std::fs::remove_file(&blank).ok();
}

#[test]
fn a_model_without_a_template_refuses_chat_and_still_completes() {
    let _one = one_at_a_time();
    let model = tiny_llama("no-template");
    let srv = ServerProc::start(&model, &["--device", "cpu", "--ctx", "64"]);
    let (status, text) = srv.post(CHAT, chat_body("hi", 2, false).to_string().as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("no_chat_template") && text.contains("--chat-template"),
        "{text}"
    );
    let body = json!({"prompt": "hello", "max_tokens": 3, "temperature": 0});
    let (status, text) = srv.post("/v1/completions", body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3, "{text}");
    drop(srv);
    std::fs::remove_file(&model).ok();
}

/// A request whose prompt and token limit need more KV blocks than the whole budget holds is
/// refused at once with the bytes it needs and the budget (issue 21: a sequence that can never
/// fit is refused, and nothing else waits on it); a request that fits is still answered.
#[test]
fn a_request_the_kv_budget_can_never_hold_is_refused_with_its_bytes() {
    let _one = one_at_a_time();
    let model = tiny_llama("never-fits");
    let file = decode::open_model(&model).expect("opens");
    let spec = decode::model::ModelSpec::from_gguf(&file).expect("spec");
    // Two blocks of positions: 32 of the context's 512.
    const CTX: usize = 512;
    let block = decode::layout::context::pool_block_bytes(&spec, CTX, 64, decode::kv::KvType::F32)
        .expect("block");
    let budget = 2 * block;
    let args = ["--device", "cpu", "--ctx", "512", "--kv-budget"];
    let budget_arg = budget.to_string();
    let srv = ServerProc::start(&model, &[&args[..], &[budget_arg.as_str()]].concat());
    let long = "the quick brown fox jumps over the lazy dog ".repeat(4);
    let body = json!({"prompt": long, "max_tokens": 8, "temperature": 0});
    let (status, text) = srv.post("/v1/completions", body.to_string().as_bytes());
    eprintln!("a request beyond the budget: {status} {text}");
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).expect("a JSON error");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("could never run")
            && message.contains(&format!("the budget is {budget} bytes"))
            && message.contains("raise the KV budget"),
        "{message}"
    );
    let body = json!({"prompt": "hello", "max_tokens": 3, "temperature": 0});
    let (status, text) = srv.post("/v1/completions", body.to_string().as_bytes());
    assert_eq!(status, 200, "a request that fits: {text}");
    drop(srv);
    std::fs::remove_file(&model).ok();
}

/// A streaming client that stops reading: once the socket's buffers and the response's
/// bounded buffer are full, the request is cancelled and its KV blocks return, while the
/// connection is still open; meanwhile other requests are answered (the step loop never
/// waits for a reader). The model name is made long (`--alias`), so each event is about 16 KB
/// and the stream's 2000 events (32 MB) overflow what the kernel buffers on loopback (Linux's
/// send buffer grows to 4 MiB by default; a receiver that never reads keeps its window small).
/// With 2 KB events the whole stream fits in those buffers and finishes uncancelled.
#[test]
fn a_client_that_stops_reading_is_cancelled_and_never_stalls_the_others() {
    use std::io::Write;
    let _one = one_at_a_time();
    let model = tiny_llama("slow-reader");
    let alias = "m".repeat(16_000);
    let srv = ServerProc::start(
        &model,
        &["--device", "cpu", "--ctx", "2048", "--alias", &alias],
    );
    let addr = srv.url("").trim_start_matches("http://").to_string();
    let body = json!({
        "prompt": "hello", "max_tokens": 2000, "temperature": 0, "stream": true,
        "ignore_eos": true,
    })
    .to_string();
    let mut tcp = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        tcp,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Never read from `tcp`; it stays open until the end of the test.
    let quick = json!({"prompt": "hi", "max_tokens": 4, "temperature": 0});
    let t = Instant::now();
    let (status, text) = srv.post("/v1/completions", quick.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    eprintln!("a request beside the stalled one took {:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(120);
    let (gone, used, running) = loop {
        let (_, text) = srv.get("/metrics");
        let metric = |k: &str| ServerProc::metric(&text, k).unwrap_or(f64::NAN);
        let gone = metric("hipdecode_requests_client_gone_total");
        let used = metric("hipdecode_kv_blocks{state=\"used\"}");
        let running = metric("hipdecode_requests_running");
        if (gone >= 1.0 && used == 0.0 && running == 0.0) || Instant::now() > deadline {
            break (gone, used, running);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        gone >= 1.0 && used == 0.0 && running == 0.0,
        "the stalled stream was not cancelled: client_gone {gone}, KV blocks used {used}, \
         running {running}\n{}",
        srv.log()
    );
    let (status, text) = srv.post("/v1/completions", quick.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    drop(tcp);
    drop(srv);
    std::fs::remove_file(&model).ok();
}

/// A tiny synthetic Llama (no chat template, 2048 positions) under the tests' scratch folder.
fn tiny_llama(tag: &str) -> std::path::PathBuf {
    let model = test_support::models::scratch_dir("serve-tests")
        .join(format!("{tag}-{}.gguf", std::process::id()));
    decode::gguf_loader::synth::write_preset(
        decode::gguf_loader::synth::Preset::TinyLlama,
        &model,
        5,
    )
    .expect("a tiny model");
    model
}

/// A tiny synthetic Qwen3 (no chat template; its output projection apart from the embedding)
/// whose embedding of the token greedy decoding draws first after `text` is NaN, as a corrupt
/// file holds it: a completion of `text` runs its prompt clean, streams that token, and its
/// next step's logits are NaN. The path, the prompt's token count and that token's text.
fn nan_after_first_token(tag: &str, text: &str) -> (std::path::PathBuf, usize, String) {
    let model = test_support::models::scratch_dir("serve-tests")
        .join(format!("{tag}-{}.gguf", std::process::id()));
    let preset = decode::gguf_loader::synth::Preset::TinyQwen3;
    decode::gguf_loader::synth::write_preset(preset, &model, 5).expect("a tiny model");
    let file = decode::open_model(&model).expect("opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    // As the server makes a completion's prompt.
    let prompt = tokenizer.encode(text, tokenizer.vocab().add_bos);
    let backend = decode::backend::cpu::CpuBackend::new(decode::backend::Precision::Fast);
    let options = ContextOptions {
        context: 64,
        ..ContextOptions::default()
    };
    let mut session = Session::load(&file, backend, options).expect("loads");
    let first = session
        .prefill_and_sample(&prompt, &SamplerConfig::GREEDY)
        .expect("samples");
    assert!(!prompt.contains(&first), "{text:?} holds its continuation");
    let mut stream = TextStream::new(&tokenizer);
    let first_text = stream.push(first) + &stream.finish();
    drop((session, file));
    let mut bytes = std::fs::read(&model).expect("reads");
    test_support::models::set_non_finite_row(
        &mut bytes,
        "token_embd.weight",
        first as usize,
        f32::NAN,
    );
    std::fs::write(&model, &bytes).expect("writes");
    (model, prompt.len(), first_text)
}

/// Engine errors reach the client as OpenAI error objects: a stream that fails after its
/// first token gets that token's delta, then an error event, then `data: [DONE]`, and
/// nothing else; the same request not streamed gets a 500 with the error object. The message
/// names the position and the tensor, and the server goes on answering.
#[test]
fn an_error_mid_stream_is_an_error_event_before_done_and_the_server_goes_on() {
    let _one = one_at_a_time();
    let text = "hello world";
    let (model, n_prompt, first_text) = nan_after_first_token("nan-mid-stream", text);
    assert!(!first_text.is_empty(), "the first token shows no text");
    let srv = ServerProc::start(&model, &["--device", "cpu", "--ctx", "64"]);
    let body = |stream: bool| {
        json!({
            "prompt": text, "max_tokens": 8, "temperature": 0, "stream": stream,
            "ignore_eos": true,
        })
    };
    let check_error = |error: &Value| {
        let e = &error["error"];
        assert_eq!(e["type"], "server_error", "{error}");
        assert!(e["param"].is_null() && e["code"].is_null(), "{error}");
        let message = e["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!(
                "the logits are not finite at position {n_prompt} "
            )) && message.contains("first non-finite output at tensor token_embd.weight")
                && message.contains("re-download or re-convert the model"),
            "{error}"
        );
    };

    let mut stream = srv.stream("/v1/completions", &body(true));
    assert_eq!(stream.status, 200);
    let mut events = Vec::new();
    while let Some(e) = stream.next_event() {
        events.push(e);
    }
    let shown: Vec<String> = events.iter().map(|e| format!("{e:?}")).collect();
    // The first token's delta, the error, [DONE], and nothing after it.
    let [SseEvent::Json(delta), SseEvent::Json(error), SseEvent::Done] = &events[..] else {
        panic!("events: {shown:#?}");
    };
    assert_eq!(delta["choices"][0]["text"], first_text.as_str(), "{delta}");
    assert!(delta["choices"][0]["finish_reason"].is_null(), "{delta}");
    check_error(error);

    let (status, reply) = srv.post("/v1/completions", body(false).to_string().as_bytes());
    assert_eq!(status, 500, "{reply}");
    check_error(&serde_json::from_str(&reply).expect("a JSON error object"));

    // Still serving: health, a request that stops before the NaN row is read, the metrics.
    assert_eq!(srv.get("/health").0, 200);
    let one = json!({"prompt": text, "max_tokens": 1, "temperature": 0});
    let (status, reply) = srv.post("/v1/completions", one.to_string().as_bytes());
    assert_eq!(status, 200, "{reply}");
    let v: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["choices"][0]["text"], first_text.as_str(), "{reply}");
    let (_, metrics) = srv.get("/metrics");
    let failed = ServerProc::metric(&metrics, "hipdecode_requests_failed_total");
    assert_eq!(failed, Some(2.0), "{metrics}");
    assert!(srv.log().contains("not finite"), "{}", srv.log());
    drop(srv);
    std::fs::remove_file(&model).ok();
}
