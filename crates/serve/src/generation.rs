//! One request's generation: its prompt made ready (template, tokens, limits), then a task that
//! submits it to the engine and turns the engine's updates into text pieces, with the stop
//! strings, the deadline and the shutdown cut applied. Streaming and non-streaming responses
//! read the same pieces; a reader that is gone or too slow cancels the request.

use crate::api::{ApiError, FinishReason, GenerationRequest, Input, Usage};
use crate::state::{Admitted, AppState, LoadedModel};
use decode::chat::encode_rendered;
use decode::chat_template::Conversation;
use decode::engine::{Delivery, EngineHandle, Update, UpdateSink};
use decode::sampler::SamplerConfig;
use decode::scheduler::{Finish, Request, RequestId};
use decode::stop_strings::StopStrings;
use decode::tokenizer::TextStream;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// Updates the engine may get ahead of this task by before it cancels the request.
const ENGINE_BUFFER: usize = 1024;
/// Pieces a response may lag behind generation by: a client that stops reading is cancelled
/// when this many wait.
pub const CLIENT_BUFFER: usize = 256;

/// A request ready for the engine.
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stops: Vec<String>,
    pub ignore_eos: bool,
}

/// The seed of a request that gave none: different per request.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// Renders and encodes the request's input and checks it against the context.
pub fn prepare(model: &LoadedModel, request: &GenerationRequest) -> Result<Prepared, ApiError> {
    let tokenizer = &model.tokenizer;
    let prompt = match &request.input {
        Input::Chat(messages) => {
            let template = model.template.as_ref().map_err(|why| {
                ApiError::field("messages", format!("chat requests are refused: {why}"))
                    .with_code("no_chat_template")
            })?;
            let text = template
                .render(&Conversation {
                    messages: messages.clone(),
                    tools: None,
                    add_generation_prompt: true,
                })
                .map_err(|e| {
                    ApiError::field("messages", format!("the chat template failed: {e}"))
                        .with_code("template_error")
                })?;
            encode_rendered(template, tokenizer, &text)
        }
        Input::Text(text) => tokenizer.encode(text, tokenizer.vocab().add_bos),
    };
    let param = match request.input {
        Input::Chat(_) => "messages",
        Input::Text(_) => "prompt",
    };
    if prompt.is_empty() {
        return Err(ApiError::field(param, "the prompt is empty (no tokens)"));
    }
    let context = model.context;
    if prompt.len() >= context {
        return Err(ApiError::field(
            param,
            format!(
                "the prompt is {} tokens, but a sequence holds {context} positions (--ctx) and \
                 at least one must be left to generate; shorten the prompt or start the server \
                 with a larger --ctx",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt.len();
    let max_tokens = match request.max_tokens {
        None => room,
        Some(n) if n <= room => n,
        Some(n) => {
            return Err(ApiError::field(
                "max_tokens",
                format!(
                    "max_tokens is {n}, but only {room} positions are left after the prompt of \
                     {} tokens in a context of {context} (--ctx); ask for at most {room}",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
    };
    let s = &request.sampling;
    let sampler = SamplerConfig {
        // OpenAI's defaults: temperature 1 and top_p 1; top-k and min-p off.
        temperature: s.temperature.unwrap_or(1.0),
        top_k: s.top_k.unwrap_or(0),
        top_p: s.top_p.unwrap_or(1.0),
        min_p: s.min_p.unwrap_or(0.0),
        repeat_penalty: s.repeat_penalty.unwrap_or(1.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        repeat_last_n: s.repeat_last_n.unwrap_or(64),
        seed: s.seed.unwrap_or_else(fresh_seed),
    };
    sampler
        .validate()
        .map_err(|e| ApiError::invalid(None, e.to_string()))?;
    Ok(Prepared {
        prompt,
        max_tokens,
        sampler,
        stops: request.stop.clone(),
        ignore_eos: request.ignore_eos,
    })
}

/// What a response reads, in order: text pieces, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Piece {
    Text(String),
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    /// The request failed after it was admitted.
    Failed(ApiError),
}

/// The engine's updates into a tokio channel, refused when this task lags.
struct ChannelSink(mpsc::Sender<Update>);

impl UpdateSink for ChannelSink {
    fn deliver(&mut self, update: Update) -> Delivery {
        match self.0.try_send(update) {
            Ok(()) => Delivery::Delivered,
            Err(mpsc::error::TrySendError::Full(_)) => Delivery::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
        }
    }
}

/// Cancels its request when dropped, unless the request ended.
struct CancelOnDrop {
    engine: EngineHandle,
    id: RequestId,
    ended: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.ended {
            self.engine.cancel(self.id);
        }
    }
}

/// Starts the request: submits it and generates in a task of its own. The first receiver
/// says whether it got a sequence (`Err` when it was refused, timed out in the queue, or the
/// server began to shut down first); then the pieces come through the second.
pub fn start(
    state: Arc<AppState>,
    model: Arc<LoadedModel>,
    prepared: Prepared,
    admitted: Admitted,
    arrived: Instant,
    deadline: Instant,
) -> (
    oneshot::Receiver<Result<(), ApiError>>,
    mpsc::Receiver<Piece>,
) {
    let (admission_tx, admission) = oneshot::channel();
    let (pieces_tx, pieces) = mpsc::channel(CLIENT_BUFFER);
    tokio::spawn(async move {
        let _admitted = admitted;
        generate(
            state,
            model,
            prepared,
            (arrived, deadline),
            admission_tx,
            pieces_tx,
        )
        .await;
    });
    (admission, pieces)
}

async fn generate(
    state: Arc<AppState>,
    model: Arc<LoadedModel>,
    prepared: Prepared,
    (arrived, deadline): (Instant, Instant),
    admission: oneshot::Sender<Result<(), ApiError>>,
    pieces: mpsc::Sender<Piece>,
) {
    let metrics = &state.metrics;
    let waited = deadline - arrived;
    let deadline = tokio::time::Instant::from_std(deadline);
    let mut cut = state.cut_signal();
    let (updates_tx, mut updates) = mpsc::channel(ENGINE_BUFFER);
    let request = Request {
        prompt: prepared.prompt.clone(),
        sampler: prepared.sampler,
        max_new: prepared.max_tokens,
        stop: if prepared.ignore_eos {
            Vec::new()
        } else {
            model.tokenizer.stop_ids().to_vec()
        },
    };
    let engine = model.engine.clone();
    let submitted = tokio::task::spawn_blocking(move || {
        engine.submit_to(request, Box::new(ChannelSink(updates_tx)))
    })
    .await;
    let id = match submitted {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => {
            let _ = admission.send(Err(ApiError::invalid(None, e.to_string())));
            return;
        }
        Err(e) => {
            let _ = admission.send(Err(ApiError::internal(format!("submitting: {e}"))));
            return;
        }
    };
    let mut guard = CancelOnDrop {
        engine: model.engine.clone(),
        id,
        ended: false,
    };
    metrics.queued.inc();
    // Counted as queued until it starts or ends, whichever way it leaves the wait.
    let queued = scopeguard(|| {
        metrics.queued.dec();
    });
    // Until it takes a sequence (nothing else comes before `Started`).
    let cached = tokio::select! {
            update = updates.recv() => match update {
                Some(Update::Started { cached }) => cached,
                Some(Update::Failed(why)) => {
                    guard.ended = true;
                    let _ = admission.send(Err(ApiError::internal(why)));
                    return;
                }
                // Nothing else comes before `Started`.
                _ => {
                    guard.ended = true;
                    let _ = admission.send(Err(ApiError::internal(
                        "the engine ended the request before it started",
                    )));
                    return;
                }
            },
            _ = tokio::time::sleep_until(deadline) => {
                metrics.deadline_in_queue.inc();
                let _ = admission.send(Err(ApiError::unavailable(
                    "queue_timeout",
                    format!(
                        "the request waited {} s for a sequence (its deadline) and was \
                         dropped; the server is busy, retry later",
                        waited.as_secs_f64()
                    ),
                )));
                return;
            }
            _ = cut.wait_for(|cut| *cut) => {
                let _ = admission.send(Err(ApiError::unavailable(
                    "shutting_down",
                    "the server is shutting down",
                )));
                return;
            }
            _ = pieces.closed() => {
                // The client left while it waited.
                return;
            }
    };
    drop(queued);
    metrics.running.inc();
    let _running = scopeguard(|| {
        metrics.running.dec();
    });
    if admission.send(Ok(())).is_err() {
        return;
    }
    metrics
        .prompt_tokens
        .inc_by((prepared.prompt.len() - cached) as u64);
    metrics.cached_prompt_tokens.inc_by(cached as u64);
    let tokenizer = Arc::clone(&model.tokenizer);
    let mut text = TextStream::new(&tokenizer);
    let mut stops = StopStrings::new(prepared.stops.iter().cloned());
    let mut usage = Usage {
        prompt_tokens: prepared.prompt.len(),
        cached_tokens: cached,
        ..Usage::default()
    };
    // Set when this task ended the request (stop string, deadline, cut): how it ends.
    let mut ending: Option<FinishReason> = None;
    let mut last_token: Option<Instant> = None;
    let send = |piece: Piece| match pieces.try_send(piece) {
        Ok(()) => true,
        Err(_) => {
            metrics.client_gone.inc();
            false
        }
    };
    loop {
        let update = tokio::select! {
            update = updates.recv() => update,
            _ = tokio::time::sleep_until(deadline), if ending.is_none() => {
                metrics.deadline_running.inc();
                ending = Some(FinishReason::Length);
                model.engine.cancel(id);
                continue;
            }
            _ = cut.wait_for(|cut| *cut), if ending.is_none() => {
                ending = Some(FinishReason::Length);
                model.engine.cancel(id);
                continue;
            }
        };
        match update {
            Some(Update::Token(token)) => {
                if ending.is_some() {
                    continue;
                }
                let now = Instant::now();
                match last_token {
                    None => metrics.ttft.observe((now - arrived).as_secs_f64()),
                    Some(t) => metrics.itl.observe((now - t).as_secs_f64()),
                }
                last_token = Some(now);
                usage.completion_tokens += 1;
                metrics.generated_tokens.inc();
                if tokenizer.is_stop(token) {
                    // An end-of-generation token is never shown (with ignore_eos it is
                    // generated like any other, still unshown).
                    continue;
                }
                let shown = stops.push(&text.push(token));
                if !shown.is_empty() && !send(Piece::Text(shown)) {
                    return;
                }
                if stops.stopped() {
                    ending = Some(FinishReason::Stop);
                    model.engine.cancel(id);
                }
            }
            Some(Update::Finished {
                reason,
                peak_kv_bytes,
            }) => {
                guard.ended = true;
                if ending.is_none() {
                    let mut tail = stops.push(&text.finish());
                    tail.push_str(&stops.finish());
                    if !tail.is_empty() && !send(Piece::Text(tail)) {
                        return;
                    }
                }
                let finish = ending.unwrap_or(match reason {
                    Finish::Stop => FinishReason::Stop,
                    Finish::TokenLimit | Finish::ContextFull | Finish::Cancelled => {
                        FinishReason::Length
                    }
                });
                usage.kv_peak_bytes = peak_kv_bytes;
                metrics.kv_peak_bytes.observe(peak_kv_bytes as f64);
                metrics.finished(finish);
                send(Piece::Done { finish, usage });
                return;
            }
            Some(Update::Failed(why)) => {
                guard.ended = true;
                metrics.failed.inc();
                send(Piece::Failed(ApiError::internal(why)));
                return;
            }
            Some(Update::Started { .. }) => {}
            None => {
                // The engine dropped the request: this task fell behind it.
                guard.ended = true;
                metrics.failed.inc();
                send(Piece::Failed(ApiError::internal(
                    "the engine ended the request: its updates were not read in time",
                )));
                return;
            }
        }
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
