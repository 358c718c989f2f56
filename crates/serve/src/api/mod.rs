//! The OpenAI wire format: request bodies checked field by field, response bodies and stream
//! chunks, and the error object.

pub mod error;
pub mod request;
pub mod response;

pub use error::ApiError;
pub use request::{Endpoint, GenerationRequest, Input, Sampling};
pub use response::{FinishReason, ResponseHeader, Usage};
