//! A conversation over one [`Session`]: each turn renders the whole conversation through the
//! chat template, keeps the KV cache of the longest token prefix it shares with what the cache
//! already holds (the earlier turns, the generated answers included), and prefills only the
//! rest. The answer stops at the model's end-of-generation tokens (EOS and the template's end of
//! turn, [`crate::tokenizer::Tokenizer::is_stop`]), which never reach its text.

use crate::backend::Backend;
use crate::chat_template::{ChatTemplate, Conversation, TemplateError};
use crate::error::DecodeError;
use crate::generate::{generate, StopReason};
use crate::sampler::SamplerConfig;
use crate::session::Session;
use crate::stop_strings::StopStrings;
use crate::tokenizer::{TextStream, Tokenizer};
use serde_json::{json, Value};
use std::cell::Cell;

/// Why a turn could not run.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(
        "the conversation is {tokens} tokens with this message, more than the {context} the \
         context holds (--ctx); /reset starts a new one"
    )]
    TooLong { tokens: usize, context: usize },
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// What one turn did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnReport {
    /// Tokens of the rendered conversation up to the answer.
    pub prompt_tokens: usize,
    /// Of those, the ones whose keys the cache already held.
    pub reused: usize,
    /// The ones this turn computed.
    pub prefilled: usize,
    /// The answer's text and tokens (no end-of-generation token).
    pub answer: String,
    pub answer_tokens: usize,
    pub stop: StopReason,
    /// The answer ended at one of the chat's stop strings (which its text leaves out).
    pub stop_string: bool,
}

/// A conversation and the tokens its session's KV cache holds.
pub struct Chat<'t, B: Backend> {
    session: Session<B>,
    tokenizer: &'t Tokenizer,
    template: ChatTemplate,
    system: Option<String>,
    /// Texts that end an answer where they appear.
    stops: Vec<String>,
    messages: Vec<Value>,
    /// The tokens whose keys and values are in the cache, in order.
    cached: Vec<u32>,
}

impl<'t, B: Backend> Chat<'t, B> {
    /// A new conversation, with `system` as its first message when given.
    pub fn new(
        session: Session<B>,
        tokenizer: &'t Tokenizer,
        template: ChatTemplate,
        system: Option<String>,
    ) -> Chat<'t, B> {
        let mut chat = Chat {
            session,
            tokenizer,
            template,
            system,
            stops: Vec::new(),
            messages: Vec::new(),
            cached: Vec::new(),
        };
        chat.reset();
        chat
    }

    /// Ends every answer where one of `stops` appears in its text (`--stop`).
    pub fn with_stop_strings(self, stops: Vec<String>) -> Chat<'t, B> {
        Chat { stops, ..self }
    }

    /// Forgets the conversation (the system message stays); the cache is reused where the next
    /// one starts the same way.
    pub fn reset(&mut self) {
        self.messages.clear();
        if let Some(system) = &self.system {
            self.messages
                .push(json!({"role": "system", "content": system}));
        }
    }

    pub fn session(&self) -> &Session<B> {
        &self.session
    }

    /// The conversation's messages so far.
    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// Adds `user` to the conversation and answers it, streaming the answer's text to
    /// `on_text` as it comes. `interrupted` is polled after every token: when it says so the
    /// answer ends there (and stays in the conversation as far as it got). A message that
    /// would not fit the context leaves the conversation as it was.
    pub fn turn(
        &mut self,
        user: &str,
        max_tokens: usize,
        sampler: SamplerConfig,
        interrupted: &dyn Fn() -> bool,
        on_text: &mut dyn FnMut(&str),
    ) -> std::result::Result<TurnReport, TurnError> {
        self.messages.push(json!({"role": "user", "content": user}));
        let prompt = match self.prompt_tokens() {
            Ok(p) => p,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        if prompt.is_empty() {
            self.messages.pop();
            return Err(TurnError::Template(TemplateError::Render {
                name: self.template.name().to_string(),
                detail: "the conversation rendered to no tokens".into(),
            }));
        }
        let context = self.session.options().context;
        if prompt.len() >= context {
            self.messages.pop();
            return Err(TurnError::TooLong {
                tokens: prompt.len(),
                context,
            });
        }
        // Keep the cache of the shared prefix; at least the last prompt token is computed, so
        // the answer's first token has logits.
        let shared = (self.cached.iter().zip(&prompt))
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        self.session.rewind(shared)?;
        self.cached.truncate(shared);
        let room = context - prompt.len();
        let tokenizer = self.tokenizer;
        let mut stream = TextStream::new(tokenizer);
        let mut stops = StopStrings::new(self.stops.iter().cloned());
        let at_stop_string = Cell::new(false);
        let mut answer = String::new();
        let report = generate(
            &mut self.session,
            &prompt[shared..],
            max_tokens.min(room),
            sampler,
            &|id| tokenizer.is_stop(id) || at_stop_string.get() || interrupted(),
            &mut |id| {
                if !tokenizer.is_stop(id) {
                    let shown = stops.push(&stream.push(id));
                    answer.push_str(&shown);
                    on_text(&shown);
                    at_stop_string.set(stops.stopped());
                }
            },
        )?;
        let mut tail = stops.push(&stream.finish());
        tail.push_str(&stops.finish());
        answer.push_str(&tail);
        on_text(&tail);
        // The cache holds the prompt and every answer token but the last (sampled, not fed).
        self.cached.extend_from_slice(&prompt[shared..]);
        let fed = report.tokens.len().saturating_sub(1);
        self.cached.extend_from_slice(&report.tokens[..fed]);
        let stopped_by_token = report.tokens.last().is_some_and(|&t| tokenizer.is_stop(t));
        let answer_tokens = report.tokens.len() - usize::from(stopped_by_token);
        self.messages
            .push(json!({"role": "assistant", "content": answer}));
        Ok(TurnReport {
            prompt_tokens: prompt.len(),
            reused: shared,
            prefilled: prompt.len() - shared,
            answer,
            answer_tokens,
            stop: report.stop,
            stop_string: stops.stopped(),
        })
    }

    /// The conversation rendered and encoded, ending with the assistant's opening. The BOS
    /// the template writes is not doubled: the tokenizer adds one only when the model wants one
    /// and the text does not begin with it.
    fn prompt_tokens(&self) -> std::result::Result<Vec<u32>, TurnError> {
        let text = self.template.render(&Conversation {
            messages: self.messages.clone(),
            tools: None,
            add_generation_prompt: true,
        })?;
        Ok(encode_rendered(&self.template, self.tokenizer, &text))
    }
}

/// Encodes a prompt `template` rendered, not doubling the BOS it wrote: the tokenizer adds
/// one only when the model wants one and the text does not begin with it.
pub fn encode_rendered(template: &ChatTemplate, tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let bos = template.bos_token();
    let add_bos = tokenizer.vocab().add_bos && (bos.is_empty() || !text.starts_with(bos));
    tokenizer.encode(text, add_bos)
}
