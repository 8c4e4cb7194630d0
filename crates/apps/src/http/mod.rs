//! HTTP plumbing shared by the apps: one serving loop (HTTP/1.1 and HTTP/2
//! prior knowledge on one port), the access log, and response helpers.

mod access_log;
mod respond;
mod server;

pub use access_log::AccessLog;
pub(crate) use respond::{json, text, with_type};
pub(crate) use server::serve;
pub use server::ConnInfo;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

/// Error type of response bodies: a streamed echo can fail mid-way when the
/// client's request body does.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body every handler returns.
pub type Body = BoxBody<Bytes, BoxError>;
