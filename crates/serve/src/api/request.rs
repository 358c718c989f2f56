//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field.
//!
//! The body must be a JSON object. Each field is checked for type and range (the ranges are
//! [`RANGES`], also in the README's server section); an OpenAI field this server does not
//! implement (`tools`, `response_format`, `logprobs`, `logit_bias`, `n` > 1, …) is refused by
//! name rather than ignored, since ignoring it would silently change the answer. Fields OpenAI
//! does not define are ignored; [`GenerationRequest::ignored`] lists them for the log.

use super::error::ApiError;
use serde_json::{Map, Value};

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What to continue: a conversation for the chat template, or raw prompt text.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The messages, each an object with a string `role` and a string `content` (text parts
    /// joined).
    Chat(Vec<Value>),
    Text(String),
}

/// How tokens are drawn; `None` where the request left a field out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<usize>,
    pub seed: Option<u64>,
}

/// A checked request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    pub endpoint: Endpoint,
    pub input: Input,
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
    /// Generate past the end-of-generation tokens (benchmarks), up to `max_tokens`.
    pub ignore_eos: bool,
    /// A deadline shorter than the server's `--timeout`, in seconds from arrival.
    pub timeout: Option<f32>,
    /// Top-level fields OpenAI does not define, ignored.
    pub ignored: Vec<String>,
}

/// The accepted range of every numeric field, as the error messages state it.
pub const RANGES: &[(&str, &str)] = &[
    (
        "max_tokens",
        "an integer >= 1 (at most the context left after the prompt)",
    ),
    ("temperature", "a number in [0, 2]; 0 is greedy"),
    ("top_p", "a number in (0, 1]"),
    ("top_k", "an integer in [0, 1000000]; 0 keeps every token"),
    ("min_p", "a number in [0, 1]"),
    ("presence_penalty", "a number in [-2, 2]"),
    ("frequency_penalty", "a number in [-2, 2]"),
    ("repeat_penalty", "a number in (0, 10]; 1 is off"),
    ("repeat_last_n", "an integer in [0, 4096]"),
    ("seed", "an integer"),
    ("n", "1"),
    (
        "timeout",
        "a number of seconds in (0, 86400]; the server's --timeout still bounds it",
    ),
];

/// Stop strings a request may give, and the longest one.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

/// Fields of both endpoints this server reads.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "n",
    "stream",
    "stream_options",
    "ignore_eos",
    "timeout",
];

/// OpenAI fields that change nothing here (bookkeeping on OpenAI's side).
const HARMLESS: &[&str] = &["user", "store", "metadata", "service_tier"];

/// OpenAI fields this server does not implement: refused when set to anything but their
/// "off" value, which [`is_off`] tells.
const UNSUPPORTED: &[&str] = &[
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "echo",
    "best_of",
    "suffix",
];

/// Whether an unsupported field's value asks for nothing (null, false, empty, `best_of` 1).
fn is_off(name: &str, v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => name == "tool_choice" && s == "none",
        Value::Number(n) => name == "best_of" && n.as_u64() == Some(1),
        Value::Bool(true) => false,
    }
}

/// Parses and checks a body sent to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenerationRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(None, format!("the body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(
            None,
            format!("the body must be a JSON object, not {}", type_name(&value)),
        ));
    };
    let own: &[&str] = match endpoint {
        Endpoint::Chat => &["messages", "max_completion_tokens"],
        Endpoint::Completion => &["prompt"],
    };
    let mut ignored = Vec::new();
    for (name, v) in &map {
        let name = name.as_str();
        if UNSUPPORTED.contains(&name) {
            if !is_off(name, v) {
                return Err(ApiError::field(
                    name,
                    format!(
                        "`{name}` is not supported by this server; leave it out (tool calls, \
                         structured output, log probabilities, logit bias and suffixes are \
                         not implemented)"
                    ),
                )
                .with_code("unsupported_field"));
            }
        } else if !(COMMON.contains(&name) || own.contains(&name) || HARMLESS.contains(&name)) {
            ignored.push(name.to_string());
        }
    }
    let fields = Fields(&map);
    let input = match endpoint {
        Endpoint::Chat => Input::Chat(messages(map.get("messages"))?),
        Endpoint::Completion => Input::Text(prompt(map.get("prompt"))?),
    };
    let max_tokens = match (fields.uint("max_tokens", 1, u32::MAX as u64)?, endpoint) {
        (Some(n), _) => Some(n as usize),
        (None, Endpoint::Chat) => fields
            .uint("max_completion_tokens", 1, u32::MAX as u64)?
            .map(|n| n as usize),
        (None, Endpoint::Completion) => None,
    };
    if let Some(n) = fields.uint("n", 1, u64::MAX)? {
        if n != 1 {
            return Err(ApiError::field(
                "n",
                format!("n = {n}: this server returns one choice per request; send n = 1 or leave it out, and send several requests for several answers"),
            )
            .with_code("unsupported_field"));
        }
    }
    let sampling = Sampling {
        temperature: fields.float("temperature", 0.0, 2.0, true)?,
        top_p: fields.float("top_p", 0.0, 1.0, false)?,
        top_k: fields.uint("top_k", 0, 1_000_000)?.map(|k| k as usize),
        min_p: fields.float("min_p", 0.0, 1.0, true)?,
        presence_penalty: fields.float("presence_penalty", -2.0, 2.0, true)?,
        frequency_penalty: fields.float("frequency_penalty", -2.0, 2.0, true)?,
        repeat_penalty: fields.float("repeat_penalty", 0.0, 10.0, false)?,
        repeat_last_n: fields.uint("repeat_last_n", 0, 4096)?.map(|n| n as usize),
        seed: fields.seed()?,
    };
    let stream = fields.bool("stream")?.unwrap_or(false);
    let include_usage = match map.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ApiError::field(
                    "stream_options.include_usage",
                    format!("must be true or false, not {}", type_name(v)),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::field(
                "stream_options",
                format!("must be an object, not {}", type_name(v)),
            ))
        }
    };
    Ok(GenerationRequest {
        endpoint,
        input,
        max_tokens,
        sampling,
        stop: stops(map.get("stop"))?,
        stream,
        include_usage,
        ignore_eos: fields.bool("ignore_eos")?.unwrap_or(false),
        timeout: fields.float("timeout", 0.0, 86400.0, false)?,
        ignored,
    })
}

/// JSON's name for a value's type, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn range_of(name: &str) -> &'static str {
    RANGES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, r)| r)
}

/// Typed reads of optional top-level fields; `null` counts as left out.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn out_of_range(name: &str, v: &Value) -> ApiError {
        ApiError::field(
            name,
            format!("`{name}` must be {}, got {v}", range_of(name)),
        )
    }

    fn uint(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n = v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(63))
                .map(|f| f as u64)
        });
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(Fields::out_of_range(name, v)),
        }
    }

    /// A number in `[min, max]`, or `(min, max]` without `min_inclusive`.
    fn float(
        &self,
        name: &str,
        min: f64,
        max: f64,
        min_inclusive: bool,
    ) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(f) if f.is_finite() && f <= max && (f > min || (min_inclusive && f == min)) => {
                Ok(Some(f as f32))
            }
            _ => Err(Fields::out_of_range(name, v)),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::field(
                name,
                format!("`{name}` must be true or false, not {}", type_name(v)),
            )),
        }
    }

    /// Any JSON integer; a negative one is taken as its 64-bit two's complement.
    fn seed(&self) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get("seed") else {
            return Ok(None);
        };
        v.as_u64()
            .or_else(|| v.as_i64().map(|i| i as u64))
            .map(Some)
            .ok_or_else(|| Fields::out_of_range("seed", v))
    }
}

/// The roles a message may have.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The messages, each reduced to its role and its text content.
fn messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => {
            return Err(ApiError::field(
                "messages",
                "`messages` is required: a non-empty array of {\"role\", \"content\"} objects",
            ))
        }
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::field(
                "messages",
                "`messages` is empty; send at least one",
            ))
        }
        Some(other) => {
            return Err(ApiError::field(
                "messages",
                format!("`messages` must be an array, not {}", type_name(other)),
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let param = |f: &str| format!("messages[{i}].{f}");
            let Value::Object(m) = m else {
                return Err(ApiError::invalid(
                    Some(format!("messages[{i}]")),
                    format!("messages[{i}] must be an object, not {}", type_name(m)),
                ));
            };
            let role = match m.get("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
                Some(Value::String(r)) => {
                    return Err(ApiError::invalid(
                        Some(param("role")),
                        format!("messages[{i}].role is \"{r}\"; it must be one of {ROLES:?}"),
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        Some(param("role")),
                        format!("messages[{i}].role must be a string, one of {ROLES:?}"),
                    ))
                }
            };
            let content = content(m.get("content"), &param("content"))?;
            Ok(serde_json::json!({ "role": role, "content": content }))
        })
        .collect()
}

/// A message's text: a string, or the text parts of an array joined.
fn content(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (k, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some(kind), _) if kind != "text" => {
                        return Err(ApiError::invalid(
                            Some(format!("{param}[{k}]")),
                            format!(
                                "{param}[{k}] is a \"{kind}\" part; this server takes text only"
                            ),
                        )
                        .with_code("unsupported_field"))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            Some(format!("{param}[{k}]")),
                            format!(
                                "{param}[{k}] must be {{\"type\": \"text\", \"text\": string}}"
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::invalid(
            Some(param.to_string()),
            format!(
                "{param} must be a string or an array of text parts, not {}",
                type_name(other)
            ),
        )),
    }
}

/// The completion prompt: a string, or an array holding one string.
fn prompt(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().unwrap_or_default().to_string())
        }
        Some(Value::Array(_)) => Err(ApiError::field(
            "prompt",
            "`prompt` as an array must hold exactly one string here (token arrays and batches \
             of prompts are not supported; send one request per prompt)",
        )),
        None | Some(Value::Null) => {
            Err(ApiError::field("prompt", "`prompt` is required: a string"))
        }
        Some(other) => Err(ApiError::field(
            "prompt",
            format!("`prompt` must be a string, not {}", type_name(other)),
        )),
    }
}

/// `stop`: a string or an array of strings.
fn stops(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(_)) => vec![v.unwrap_or(&Value::Null)],
        Some(Value::Array(a)) => a.iter().collect(),
        Some(other) => {
            return Err(ApiError::field(
                "stop",
                format!(
                    "`stop` must be a string or an array of strings, not {}",
                    type_name(other)
                ),
            ))
        }
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::field(
            "stop",
            format!("`stop` has {} strings; at most {MAX_STOPS}", list.len()),
        ));
    }
    list.into_iter()
        .map(|s| match s {
            Value::String(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.clone()),
            Value::String(s) if s.is_empty() => {
                Err(ApiError::field("stop", "a stop string is empty"))
            }
            Value::String(_) => Err(ApiError::field(
                "stop",
                format!("a stop string is longer than {MAX_STOP_BYTES} bytes"),
            )),
            other => Err(ApiError::field(
                "stop",
                format!("`stop` must hold strings, not {}", type_name(other)),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenerationRequest, ApiError> {
        parse(Endpoint::Chat, body.as_bytes())
    }

    #[test]
    fn a_full_chat_request_reads_every_field() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
                "max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":20,"min_p":0.05,"seed":-1,
                "stop":["\n\n","END"],"presence_penalty":0.5,"frequency_penalty":-0.5,
                "repeat_penalty":1.1,"n":1,"stream":true,"stream_options":{"include_usage":true},
                "ignore_eos":true,"user":"u","my_extension":3}"#,
        )
        .unwrap();
        let Input::Chat(m) = &r.input else { panic!() };
        assert_eq!(m[1]["content"], "hi there");
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.sampling.top_k, Some(20));
        assert_eq!(r.sampling.seed, Some(u64::MAX));
        assert_eq!(r.stop, ["\n\n", "END"]);
        assert!(r.stream && r.include_usage && r.ignore_eos);
        assert_eq!(r.ignored, ["my_extension"]);
    }

    #[test]
    fn bad_values_name_the_field_and_its_range() {
        for (body, param) in [
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":2.5}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#,
                "top_p",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#,
                "max_tokens",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, "n"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
                "tools",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
                "logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":5}}"#,
                "logit_bias",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#,
                "response_format",
            ),
            (
                r#"{"messages":[{"role":"wizard","content":"x"}]}"#,
                "messages[0].role",
            ),
            (r#"{"messages":[]}"#, "messages"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#,
                "stop",
            ),
        ] {
            let e = chat(body).expect_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert!(
                e.message.contains(param.split('[').next().unwrap()),
                "{e:?}"
            );
        }
        // Off values of unsupported fields are fine.
        chat(r#"{"messages":[{"role":"user","content":"x"}],"tools":[],"logprobs":false,"logit_bias":{}}"#)
            .unwrap();
    }

    #[test]
    fn malformed_bodies_are_told_apart_from_bad_fields() {
        for body in [&b"{"[..], b"[1,2]", b"\xff\xfe{}", b"{\"messages\": NaN}"] {
            let e = parse(Endpoint::Chat, body).expect_err("refused");
            assert_eq!(e.status, 400);
            assert!(e.param.is_none(), "{e:?}");
        }
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        let e = parse(Endpoint::Chat, deep.as_bytes()).expect_err("too deep");
        assert!(e.message.contains("recursion"), "{e:?}");
    }

    #[test]
    fn a_completion_takes_a_prompt_string() {
        let r = parse(
            Endpoint::Completion,
            br#"{"prompt":["once"],"max_tokens":3}"#,
        )
        .unwrap();
        assert_eq!(r.input, Input::Text("once".into()));
        let e = parse(Endpoint::Completion, br#"{"prompt":[1,2,3]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = parse(Endpoint::Completion, br#"{"prompt":"x","echo":true}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
    }
}
