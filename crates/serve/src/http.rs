//! The HTTP layer: routes, the bearer-key check, body limits, and the two response forms of a
//! generation (one JSON body, or server-sent events ending in `data: [DONE]`).

use crate::api::request::{self, Endpoint};
use crate::api::{ApiError, ResponseHeader};
use crate::generation::{self, Piece};
use crate::state::{AppState, LoadedModel};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::json;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Every route of the server.
pub fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body))
        .with_state(state)
}

/// `/v1/*` and `/metrics` need the key when the server has one.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let error = match given {
            None => Some("no API key: send the header `Authorization: Bearer <key>`"),
            Some(g) if !same_key(g.as_bytes(), key.as_bytes()) => Some("the API key is wrong"),
            Some(_) => None,
        };
        if let Some(message) = error {
            state.metrics.refused("unauthorized");
            return ApiError::unauthorized(message).into_response();
        }
    }
    next.run(request).await
}

/// Compares keys in time that depends on their lengths only.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (status, text) = if state.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if state.model.get().is_none() {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    } else {
        (StatusCode::OK, "ok")
    };
    (status, Json(json!({ "status": text }))).into_response()
}

async fn not_found() -> ApiError {
    ApiError::status(
        StatusCode::NOT_FOUND,
        "no such route; this server has POST /v1/chat/completions, POST /v1/completions, \
         GET /v1/models, GET /health and GET /metrics",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    )
}

/// The model, or 503 while it loads.
fn ready(state: &AppState) -> Result<Arc<LoadedModel>, ApiError> {
    state
        .model
        .get()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("loading", "the model is still loading"))
}

async fn models(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let model = ready(&state)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": model.name,
            "object": "model",
            "created": 0,
            "owned_by": "hipdecode",
            "context_length": model.context,
            "parallel_sequences": model.sequences,
            "kv_budget_bytes": model.kv_budget_bytes,
            "kv_bytes_per_token": model.kv_bytes_per_token,
            "chat_template": model.template.is_ok(),
        }],
    }))
    .into_response())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Some(model) = state.model.get() {
        let engine = model.engine.clone();
        if let Ok(Ok(stats)) = tokio::task::spawn_blocking(move || engine.stats()).await {
            state.metrics.update(&stats);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, Endpoint::Chat, body).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, Endpoint::Completion, body).await
}

/// Response ids, unique within the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

async fn complete(
    state: Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    match generate(Arc::clone(&state), endpoint, body, arrived).await {
        Ok(response) => response,
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), "refused: {}", e.message);
            state.metrics.refused(match e.status.as_u16() {
                413 => "too_large",
                503 => e.code.unwrap_or("unavailable"),
                s if s < 500 => "invalid",
                _ => "server_error",
            });
            e.into_response()
        }
    }
}

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "the body is larger than {} bytes (the server's --max-body)",
                state.config.max_body
            )
        } else {
            format!("the body could not be read: {}", rejection.body_text())
        };
        ApiError::status(status, message)
    })?;
    if state.draining() {
        return Err(ApiError::unavailable(
            "shutting_down",
            "the server is shutting down",
        ));
    }
    let model = ready(&state)?;
    let request = request::parse(endpoint, &body)?;
    if !request.ignored.is_empty() {
        tracing::info!(
            "ignored fields OpenAI does not define: {:?}",
            request.ignored
        );
    }
    let capacity = model.sequences + state.config.max_queue;
    let admitted = state.admit(capacity).ok_or_else(|| {
        ApiError::unavailable(
            "queue_full",
            format!(
                "the server is full: {} requests run and {} wait (--max-queue); retry later",
                model.sequences, state.config.max_queue
            ),
        )
    })?;
    // Rendering and tokenizing may take a while on a long prompt: off the runtime's threads.
    let (stream, include_usage) = (request.stream, request.include_usage);
    let timeout = (request.timeout)
        .map(|t| std::time::Duration::from_secs_f32(t).min(state.config.timeout))
        .unwrap_or(state.config.timeout);
    let prepared = {
        let model = Arc::clone(&model);
        tokio::task::spawn_blocking(move || generation::prepare(&model, &request))
            .await
            .map_err(|e| ApiError::internal(format!("preparing the prompt: {e}")))??
    };
    let header = ResponseHeader {
        endpoint,
        id: format!(
            "{}-{}",
            match endpoint {
                Endpoint::Chat => "chatcmpl",
                Endpoint::Completion => "cmpl",
            },
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: model.name.clone(),
    };
    let (admission, pieces) = generation::start(
        Arc::clone(&state),
        model,
        prepared,
        admitted,
        arrived,
        arrived + timeout,
    );
    admission
        .await
        .map_err(|_| ApiError::internal("the request's task ended before it started"))??;
    if stream {
        Ok(Sse::new(events(header, include_usage, pieces))
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        collect(header, pieces).await
    }
}

/// The whole answer as one body.
async fn collect(
    header: ResponseHeader,
    mut pieces: tokio::sync::mpsc::Receiver<Piece>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(piece) = pieces.recv().await {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Done { finish, usage } => {
                return Ok(Json(header.body(&text, finish, usage)).into_response())
            }
            Piece::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the request ended without an answer"))
}

fn data(value: serde_json::Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
}

fn done() -> Result<Event, Infallible> {
    Ok(Event::default().data("[DONE]"))
}

/// The answer as server-sent events: a chunk per piece of text, the finish chunk, the usage
/// chunk when asked for, `[DONE]`. An error after the stream began is a last event with the
/// error object, then `[DONE]`.
fn events(
    header: ResponseHeader,
    include_usage: bool,
    pieces: tokio::sync::mpsc::Receiver<Piece>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let opening = match header.endpoint {
        Endpoint::Chat => vec![data(header.delta("", true))],
        Endpoint::Completion => Vec::new(),
    };
    let body = stream::unfold(Some(pieces), move |pieces| {
        let header = header.clone();
        async move {
            let mut pieces = pieces?;
            let (events, next) = match pieces.recv().await {
                Some(Piece::Text(t)) => (vec![data(header.delta(&t, false))], Some(pieces)),
                Some(Piece::Done { finish, usage }) => {
                    let mut events = vec![data(header.finish(finish))];
                    if include_usage {
                        events.push(data(header.usage_chunk(usage)));
                    }
                    events.push(done());
                    (events, None)
                }
                Some(Piece::Failed(e)) => (vec![data(e.body()), done()], None),
                None => (
                    vec![
                        data(ApiError::internal("the request ended without an answer").body()),
                        done(),
                    ],
                    None,
                ),
            };
            Some((stream::iter(events), next))
        }
    })
    .flatten();
    stream::iter(opening).chain(body)
}
