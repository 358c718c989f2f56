//! Chat templates render as Hugging Face transformers renders them: every template of the test
//! data (`tests/data/chat_templates`, sources in its SOURCES.md) over several conversations,
//! byte for byte against Python jinja2 with transformers' environment and helpers
//! (`tests/reference/render_chat_template.py`), on one fixed clock. A template that refuses a
//! conversation, one that never ends and one that does not parse are errors that name it; a
//! model without a template says so.

mod common;

use decode::chat_template::{ChatTemplate, Conversation, TemplateError};
use decode::gguf_loader::synth::Preset;
use decode::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use test_support::models::{skip_unless_required, workspace_root};

/// The fixed clock of both renderers.
const NOW: &str = "2026-07-26T09:05:00";

fn clock() -> jiff::Zoned {
    format!("{NOW}[UTC]").parse().expect("a zoned time")
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat_templates")
        .join(name)
}

/// (file, BOS text, EOS text) of every template in the test data: the text of the tokens that
/// the model's tokenizer_config.json names `bos_token` and `eos_token` (empty where it names
/// none).
const TEMPLATES: [(&str, &str, &str); 8] = [
    ("smollm2-135m-instruct.jinja", "<|im_start|>", "<|im_end|>"),
    ("qwen3-4b-thinking-2507.jinja", "", "<|im_end|>"),
    ("qwen2.5-7b-instruct.jinja", "", "<|im_end|>"),
    (
        "llama-3.1-8b-instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    (
        "llama-3.2-3b-instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    ("gemma-3-it.jinja", "<bos>", "<eos>"),
    ("mistral-nemo-instruct-2407.jinja", "<s>", "</s>"),
    ("phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
];

fn template(file: &str, bos: &str, eos: &str) -> (String, ChatTemplate) {
    let source = std::fs::read_to_string(data(file)).expect("the template file");
    let t = ChatTemplate::new(file, source.clone(), bos, eos)
        .expect("the template compiles")
        .with_clock(clock())
        .expect("with the fixed clock");
    (source, t)
}

/// What Python jinja2 renders (`Err` with its message where the template raised), or `None`
/// when python3 with jinja2 is not there.
fn python(source: &str, bos: &str, eos: &str, c: &Conversation) -> Option<Result<String, String>> {
    let script = workspace_root().join("tests/reference/render_chat_template.py");
    let request = json!({
        "template": source,
        "bos_token": bos,
        "eos_token": eos,
        "messages": c.messages,
        "tools": c.tools,
        "add_generation_prompt": c.add_generation_prompt,
        "now": NOW,
    });
    let child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        return skip_unless_required("python3 is not installed");
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("the request reaches python");
    let out = child.wait_with_output().expect("python3 ends");
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => Some(Ok(String::from_utf8(out.stdout).expect("utf-8"))),
        Some(2) => skip_unless_required(&format!(
            "{stderr} (or `python3 -m pip install -r tests/reference/requirements.txt`)"
        )),
        Some(3) => Some(Err(stderr)),
        _ => panic!("render_chat_template.py failed: {stderr}"),
    }
}

fn conversation(
    messages: Value,
    tools: Option<Value>,
    add_generation_prompt: bool,
) -> Conversation {
    let list = |v: Value| v.as_array().expect("a list").clone();
    Conversation {
        messages: list(messages),
        tools: tools.map(list),
        add_generation_prompt,
    }
}

/// Conversations that reach each template's branches: with and without a system prompt, many
/// turns, with and without the generation prompt, reasoning inside the content, tool
/// definitions alone and with calls, one call with its id and result (the form the Llama 3.x and
/// Mistral templates accept) and two calls with arguments as an object and as a string,
/// consecutive tool results, roles out of order (which the Gemma and Mistral templates refuse),
/// and text that JSON and Jinja escape.
fn conversations() -> Vec<(&'static str, Conversation)> {
    let weather = json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather at a place, «today»",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]
            }
        }
    });
    let now = json!({
        "type": "function",
        "function": {
            "name": "now",
            "description": "The time now",
            "parameters": {"type": "object", "properties": {}}
        }
    });
    vec![
        (
            "one user turn",
            conversation(json!([{"role": "user", "content": "Hello!"}]), None, true),
        ),
        (
            "system, then turns",
            conversation(
                json!([
                    {"role": "system", "content": "You answer in one line."},
                    {"role": "user", "content": "What is 2 + 2?"},
                    {"role": "assistant", "content": "4."},
                    {"role": "user", "content": "And \"3 + 3\"?\n{{ not a tag }} \\ é ü 漢字"}
                ]),
                None,
                true,
            ),
        ),
        (
            "reasoning in the last answer, no generation prompt",
            conversation(
                json!([
                    {"role": "user", "content": "Think first."},
                    {"role": "assistant", "content": "<think>\nThe user wants thought.\n</think>\n\nDone."}
                ]),
                None,
                false,
            ),
        ),
        (
            "tools and calls",
            conversation(
                json!([
                    {"role": "system", "content": "Use tools."},
                    {"role": "user", "content": "Weather in Paris and Oslo?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
                    ]},
                    {"role": "tool", "content": "sunny, 24 °C"},
                    {"role": "tool", "content": "rain"},
                    {"role": "assistant", "content": "Paris is sunny; Oslo has rain."},
                    {"role": "user", "content": "<tool_response>not really</tool_response>"}
                ]),
                Some(json!([weather])),
                true,
            ),
        ),
        (
            "system and turns, ending on an answer",
            conversation(
                json!([
                    {"role": "system", "content": "  Be brief.  "},
                    {"role": "user", "content": "Name a colour."},
                    {"role": "assistant", "content": "Blue."},
                    {"role": "user", "content": "Another?"},
                    {"role": "assistant", "content": " Green. "}
                ]),
                None,
                false,
            ),
        ),
        (
            "tools offered, none called yet",
            conversation(
                json!([
                    {"role": "system", "content": "You may use tools."},
                    {"role": "user", "content": "Will it rain in Oslo?"}
                ]),
                Some(json!([weather, now])),
                true,
            ),
        ),
        (
            "one call with its id and result",
            conversation(
                json!([
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "call0Ab9z", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}
                    ]},
                    {"role": "tool", "tool_call_id": "call0Ab9z", "name": "get_weather", "content": "sunny, 24 °C"},
                    {"role": "assistant", "content": "Sunny and 24 °C."},
                    {"role": "user", "content": "Thanks!"}
                ]),
                Some(json!([weather])),
                true,
            ),
        ),
        (
            "roles out of order",
            conversation(
                json!([
                    {"role": "user", "content": "One."},
                    {"role": "user", "content": "Two."}
                ]),
                None,
                true,
            ),
        ),
    ]
}

/// The (template, conversation) pairs that the template refuses through `raise_exception`; it
/// renders every other conversation. Both renderers must agree.
const REFUSALS: [(&str, &str); 7] = [
    // Llama 3.x: two calls in one message.
    ("llama-3.1-8b-instruct.jinja", "tools and calls"),
    ("llama-3.2-3b-instruct.jinja", "tools and calls"),
    // Gemma 3: tool turns, like two user turns, break its strict user/model alternation.
    ("gemma-3-it.jinja", "tools and calls"),
    ("gemma-3-it.jinja", "one call with its id and result"),
    ("gemma-3-it.jinja", "roles out of order"),
    // Mistral Nemo: calls without a nine-character id; two user turns.
    ("mistral-nemo-instruct-2407.jinja", "tools and calls"),
    ("mistral-nemo-instruct-2407.jinja", "roles out of order"),
];

#[test]
fn every_template_renders_as_transformers_renders_it() {
    let mut compare = true;
    for (file, bos, eos) in TEMPLATES {
        let (source, t) = template(file, bos, eos);
        for (what, c) in conversations() {
            let got = t.render(&c);
            let refused = matches!(got, Err(TemplateError::Raised { .. }));
            assert_eq!(
                refused,
                REFUSALS.contains(&(file, what)),
                "{file}, {what}: {got:?}"
            );
            if !compare {
                continue;
            }
            let Some(want) = python(&source, bos, eos, &c) else {
                compare = false;
                continue;
            };
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{file}, {what}"),
                (Err(TemplateError::Raised { message, .. }), Err(py)) => {
                    assert_eq!(message, py, "{file}, {what}: the refusal")
                }
                (got, want) => panic!("{file}, {what}: {got:?} where jinja2 gives {want:?}"),
            }
        }
    }
}

/// Llama 3.2 dates its system prompt with `strftime_now` (here the fixed clock); Llama 3.1,
/// without a `date_string`, with the date its template names.
#[test]
fn llama_templates_date_the_system_prompt() {
    let c = conversation(json!([{"role": "user", "content": "Hi"}]), None, true);
    for (file, date) in [
        ("llama-3.2-3b-instruct.jinja", "26 Jul 2026"),
        ("llama-3.1-8b-instruct.jinja", "26 Jul 2024"),
    ] {
        let (_, t) = template(file, "<|begin_of_text|>", "<|eot_id|>");
        let got = t.render(&c).expect("renders");
        let want = format!(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
             Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n<|eot_id|>"
        );
        assert!(got.starts_with(&want), "{file}: {got:?}");
    }
}

#[test]
fn the_smollm2_file_holds_the_template_tested_here() {
    let path = test_support::models::models_dir().join("smollm2-135m-instruct-q4_1.gguf");
    if !path.exists() {
        skip_unless_required::<()>(&format!(
            "{} is absent (run `cargo xtask fetch-model smollm2-135m`)",
            path.display()
        ));
        return;
    }
    let file = decode::open_model(&path).expect("the model opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("its tokenizer");
    let t = ChatTemplate::from_gguf(&file, &tokenizer, "smollm2").expect("its template");
    let want = std::fs::read_to_string(data(TEMPLATES[0].0)).expect("the test data");
    assert_eq!(t.source(), want);
    assert_eq!(
        (t.bos_token(), t.eos_token()),
        (TEMPLATES[0].1, TEMPLATES[0].2)
    );
}

#[test]
fn helpers_write_what_python_writes() {
    // tojson with and without indent, strftime_now on the fixed clock, Python string methods.
    let source = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|\
                  {{ strftime_now('%d %b %Y, %A %H:%M') }}|{{ 'a,b'.split(',') | tojson }}|\
                  {{ '  x  '.strip() }}{{ 'Ab'.upper() }}{{ 'x'.startswith('x') }}";
    let t = ChatTemplate::new("helpers", source, "", "")
        .and_then(|t| t.with_clock(clock()))
        .expect("compiles");
    let c = conversation(
        json!([]),
        Some(json!([{"name": "f", "args": [1, 2.5, "é\"\n"], "nested": {"k": null, "b": true}}])),
        false,
    );
    let got = t.render(&c).expect("renders");
    assert!(got.contains("26 Jul 2026, Sunday 09:05"), "{got}");
    if let Some(want) = python(source, "", "", &c) {
        assert_eq!(got, want.expect("python renders"));
    }
}

#[test]
fn refusals_loops_and_bad_templates_are_errors_that_name_the_template() {
    let c = conversation(json!([{"role": "tool", "content": "x"}]), None, true);
    let refuse =
        "{% if messages[0].role == 'tool' %}{{ raise_exception('no tool first') }}{% endif %}";
    let t = ChatTemplate::new("refusing.jinja", refuse, "", "").expect("compiles");
    assert_eq!(
        t.render(&c),
        Err(TemplateError::Raised {
            name: "refusing.jinja".into(),
            message: "no tool first".into()
        })
    );
    if let Some(py) = python(refuse, "", "", &c) {
        assert_eq!(py, Err("no tool first".into()));
    }
    // Nested loops that would run 10^12 times stop on the fuel, not on the clock.
    let endless =
        "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}x{% endfor %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new("endless.jinja", endless, "", "").expect("compiles");
    let started = std::time::Instant::now();
    let e = t.render(&c).expect_err("it runs out");
    assert!(matches!(e, TemplateError::Limit { .. }), "{e}");
    assert!(e.to_string().contains("endless.jinja"), "{e}");
    assert!(
        started.elapsed().as_secs() < 60,
        "the limit took {:?}",
        started.elapsed()
    );
    let e = ChatTemplate::new("broken.jinja", "{% for m in messages %}", "", "")
        .expect_err("an unclosed block");
    assert!(
        matches!(&e, TemplateError::Syntax { name, .. } if name == "broken.jinja"),
        "{e}"
    );
}

#[test]
fn a_model_without_a_template_says_so() {
    let file = common::preset_file(Preset::TinyLlama);
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let e = ChatTemplate::from_gguf(&file, &tokenizer, "tiny-llama").expect_err("no template");
    assert_eq!(
        e,
        TemplateError::Missing {
            model: "tiny-llama".into()
        }
    );
    assert!(e.to_string().contains("--chat-template"), "{e}");
}
