//! Small constructors for the answers the apps give, so that every handler
//! sets status, content type and length the same way.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::Body;

/// A plain-text answer; a trailing newline is added so `curl` output is tidy.
pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut body = body.into();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    with_type(status, "text/plain; charset=utf-8", Bytes::from(body))
}

/// A pretty-printed JSON answer.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    // Serialising a `Value` cannot fail: its map keys are always strings.
    let mut body = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".to_owned());
    body.push('\n');
    with_type(status, "application/json", Bytes::from(body))
}

/// An answer with an explicit content type (e.g. HTML).
pub(crate) fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
