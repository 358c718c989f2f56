//! The OpenAI error object, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
//! status that goes with it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refused or failed request: what the client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A short machine-readable reason.
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header (503s).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.into(),
            code: None,
            retry_after: None,
        }
    }

    /// 400 for a field named `param`.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(Some(param.to_string()), message)
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    /// 401: no key, or the wrong one.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: message.into(),
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After`: come back later (queue full, loading, shutting down).
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: Some(code),
            retry_after: Some(1),
        }
    }

    /// 500: the server failed at something that is not the request's fault.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// Any other status (404, 405, 413), as an invalid request.
    pub fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            ..ApiError::invalid(None, message)
        }
    }

    /// The JSON object (also the payload of a stream's final error event).
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
