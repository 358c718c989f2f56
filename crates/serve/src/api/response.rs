//! Response bodies and stream chunks of the two completion endpoints, in OpenAI's shapes.

use super::request::Endpoint;
use serde_json::{json, Value};

/// Why generation ended, as OpenAI spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, the context's end, the request's deadline or the server's shutdown.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A request's token counts, and the KV bytes it held at its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache, not computed again.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub kv_peak_bytes: u64,
}

impl Usage {
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
            "kv_peak_bytes": self.kv_peak_bytes,
        })
    }
}

/// What every body and chunk of one response shares.
#[derive(Clone, Debug)]
pub struct ResponseHeader {
    pub endpoint: Endpoint,
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
}

impl ResponseHeader {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn with(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// The whole answer of a request that did not stream.
    pub fn body(&self, text: &str, finish: FinishReason, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        let mut body = self.with(false, json!([choice]));
        body["usage"] = usage.to_json();
        body
    }

    /// A chunk of streamed text (the first chat chunk also carries the role).
    pub fn delta(&self, text: &str, first: bool) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat if first => json!({
                "index": 0,
                "delta": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": null,
            }),
            Endpoint::Chat => json!({
                "index": 0,
                "delta": { "content": text },
                "logprobs": null,
                "finish_reason": null,
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": null,
            }),
        };
        self.with(true, json!([choice]))
    }

    /// The chunk that says why the stream ended.
    pub fn finish(&self, finish: FinishReason) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": "",
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        self.with(true, json!([choice]))
    }

    /// The last chunk of a stream that asked for usage (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut chunk = self.with(true, json!([]));
        chunk["usage"] = usage.to_json();
        chunk
    }
}
