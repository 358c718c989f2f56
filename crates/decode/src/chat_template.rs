//! Chat templates: the Jinja template a model file carries (`tokenizer.chat_template`), or one
//! given as a file, rendered as Hugging Face transformers renders it, so a conversation reaches
//! the model in the text it was trained on.
//!
//! transformers renders with jinja2's sandboxed environment with `trim_blocks` and
//! `lstrip_blocks`, loop controls, and these helpers, which the published templates call; here
//! they are minijinja's, with Python's string and dict methods from minijinja-contrib's
//! `pycompat`:
//! - `raise_exception(message)`: the template refuses the conversation ([`TemplateError::Raised`]);
//! - `strftime_now(format)`: the current date and time through a strftime format (a fixed clock
//!   for tests, [`ChatTemplate::with_clock`]);
//! - the `tojson` filter as Python's `json.dumps(x, ensure_ascii=False)` writes it (`", "` and
//!   `": "` between items, an `indent` argument for the indented form);
//! - the variables `messages`, `tools`, `add_generation_prompt`, `bos_token` and `eos_token`.
//!
//! Rendering is bounded: minijinja's fuel caps the instructions a render runs and the output
//! is capped at [`MAX_OUTPUT_BYTES`], so a template that loops or a conversation that is far
//! too long is an error naming the template, never a hang.

use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

/// Most bytes a rendered prompt may have: far more than any context holds.
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;

/// Instructions one render may run (minijinja's fuel). A long conversation through a
/// published template takes well under a thousandth of it per message.
const FUEL: u64 = 50_000_000;

/// The name under which the environment holds the template.
const TEMPLATE: &str = "chat";

/// The marker `raise_exception` puts before its message, so a refusal is told from other
/// failures.
const RAISED: &str = "raise_exception: ";

/// Why a chat template could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("{model} has no chat template (tokenizer.chat_template); give one with --chat-template FILE, or send a completion instead")]
    Missing { model: String },
    #[error("the chat template {name} does not parse: {detail}")]
    Syntax { name: String, detail: String },
    #[error("the chat template {name} refused the conversation: {message}")]
    Raised { name: String, message: String },
    #[error("the chat template {name} ran past its limit ({what}); the conversation is too long, or the template does not end")]
    Limit { name: String, what: String },
    #[error("rendering the chat template {name} failed: {detail}")]
    Render { name: String, detail: String },
    #[error("cannot read the chat template {path}: {reason}")]
    Unreadable { path: String, reason: String },
}

/// What `strftime_now` reads.
#[derive(Clone, Debug)]
enum Clock {
    System,
    Fixed(jiff::Zoned),
}

/// One conversation to render.
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    /// The messages, as the OpenAI API and the templates know them: objects with `role` and
    /// `content`, and whatever else a template reads (`tool_calls`, `reasoning_content`).
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions, for templates with a tool branch.
    pub tools: Option<Vec<serde_json::Value>>,
    /// End with the opening of the assistant's turn.
    pub add_generation_prompt: bool,
}

/// A compiled chat template and the special tokens it may print.
pub struct ChatTemplate {
    name: String,
    source: String,
    bos_token: String,
    eos_token: String,
    /// The compiled template, its helpers reading the clock it was made with.
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `name` says where it came from in errors (a file, or the model's
    /// metadata key).
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let (name, source) = (name.into(), source.into());
        let env = environment(&name, &source, Clock::System)?;
        Ok(ChatTemplate {
            name,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            env,
        })
    }

    /// The template for model `file` (named `model` in errors): the one at `path` when given
    /// (`--chat-template`), else the file's own; either way with the text of the model's BOS
    /// and EOS tokens.
    pub fn for_model(
        file: &gguf_loader::GgufFile,
        tokenizer: &crate::tokenizer::Tokenizer,
        model: &str,
        path: Option<&std::path::Path>,
    ) -> Result<ChatTemplate, TemplateError> {
        let Some(path) = path else {
            return ChatTemplate::from_gguf(file, tokenizer, model);
        };
        let source = std::fs::read_to_string(path).map_err(|e| TemplateError::Unreadable {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let (bos, eos) = special_tokens(file, tokenizer);
        ChatTemplate::new(path.display().to_string(), source, bos, eos)
    }

    /// The template of `file` (its `tokenizer.chat_template`), with the text of its BOS and
    /// EOS tokens from `tokenizer`; [`TemplateError::Missing`] when it has none.
    pub fn from_gguf(
        file: &gguf_loader::GgufFile,
        tokenizer: &crate::tokenizer::Tokenizer,
        model: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        const KEY: &str = "tokenizer.chat_template";
        let source = match file.get(KEY) {
            None => {
                return Err(TemplateError::Missing {
                    model: model.to_string(),
                })
            }
            Some(v) => v.as_str().ok_or_else(|| TemplateError::Syntax {
                name: format!("{model}:{KEY}"),
                detail: format!("the value is {}, not a string", v.type_name()),
            })?,
        };
        let (bos, eos) = special_tokens(file, tokenizer);
        ChatTemplate::new(format!("{model}:{KEY}"), source, bos, eos)
    }

    /// The same template with `strftime_now` reading `now` instead of the system clock.
    pub fn with_clock(self, now: jiff::Zoned) -> Result<ChatTemplate, TemplateError> {
        let env = environment(&self.name, &self.source, Clock::Fixed(now))?;
        Ok(ChatTemplate { env, ..self })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `conversation` into the prompt text.
    pub fn render(&self, conversation: &Conversation) -> Result<String, TemplateError> {
        let name = || self.name.clone();
        let template = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| render_error(&self.name, &e))?;
        let ctx = minijinja::context! {
            messages => Value::from(Serde(&conversation.messages)),
            tools => conversation.tools.as_ref().map(|t| Value::from(Serde(t))),
            add_generation_prompt => conversation.add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let mut out = Bounded(String::new());
        template
            .render_captured_to(ctx, &mut out)
            .map_err(|e| render_error(&self.name, &e))?;
        if out.0.len() > MAX_OUTPUT_BYTES {
            return Err(TemplateError::Limit {
                name: name(),
                what: format!("{MAX_OUTPUT_BYTES} bytes of output"),
            });
        }
        Ok(out.0)
    }
}

/// The text of `file`'s BOS and EOS tokens (empty where it names none).
fn special_tokens(
    file: &gguf_loader::GgufFile,
    tokenizer: &crate::tokenizer::Tokenizer,
) -> (String, String) {
    let token = |key: &str| {
        file.get_u32(key)
            .ok()
            .filter(|&id| (id as usize) < tokenizer.len())
            .map(|id| String::from_utf8_lossy(tokenizer.token_bytes(id)).into_owned())
            .unwrap_or_default()
    };
    (
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    )
}

/// A string that refuses to grow past [`MAX_OUTPUT_BYTES`] (one byte over, to tell the cap).
struct Bounded(String);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT_BYTES + 1 {
            return Err(std::io::Error::other("the output cap"));
        }
        // minijinja writes whole UTF-8 strings.
        self.0.push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn environment(
    name: &str,
    source: &str,
    clock: Clock,
) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TemplateError::Syntax {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
    env.set_syntax(syntax);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, _> {
        Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("{RAISED}{message}"),
        ))
    });
    env.add_function(
        "strftime_now",
        move |format: String| -> Result<String, minijinja::Error> {
            let now = match &clock {
                Clock::System => jiff::Zoned::now(),
                Clock::Fixed(now) => now.clone(),
            };
            jiff::fmt::strtime::format(&format, &now).map_err(|e| {
                minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now({format:?}): {e}"),
                )
            })
        },
    );
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE, source.to_string())
        .map_err(|e| TemplateError::Syntax {
            name: name.to_string(),
            detail: detail(&e),
        })?;
    Ok(env)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "` between
/// items without an indent, `","` and newlines with one.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let invalid = |e: serde_json::Error| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"))
    };
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            value
                .serialize(&mut serde_json::Serializer::with_formatter(&mut out, f))
                .map_err(invalid)?;
        }
        None => value
            .serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, PythonJson,
            ))
            .map_err(invalid)?,
    }
    // serde_json writes UTF-8.
    Ok(Value::from_safe_string(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// serde_json's compact form with Python's separators.
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// minijinja's error with its causes, on one line.
fn detail(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The message of a `raise_exception` in `e` or its causes, without minijinja's location.
fn raised_message(e: &minijinja::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        let found = (err.downcast_ref::<minijinja::Error>())
            .and_then(|m| m.detail())
            .and_then(|d| d.strip_prefix(RAISED));
        if let Some(message) = found {
            return Some(message.to_string());
        }
        current = err.source();
    }
    None
}

fn render_error(name: &str, e: &minijinja::Error) -> TemplateError {
    let name = name.to_string();
    if let Some(message) = raised_message(e) {
        return TemplateError::Raised { name, message };
    }
    let text = detail(e);
    match e.kind() {
        ErrorKind::OutOfFuel => TemplateError::Limit {
            name,
            what: format!("{FUEL} instructions"),
        },
        ErrorKind::WriteFailure => TemplateError::Limit {
            name,
            what: format!("{MAX_OUTPUT_BYTES} bytes of output"),
        },
        _ => TemplateError::Render { name, detail: text },
    }
}
