//! The bodies a request carries: the client's as it comes (counted and
//! watched), and the waypoint's own answers.

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;

/// An answer's body, whoever wrote it.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// A request's body, its bytes counted for `istio_request_bytes`, its
/// activity watched for the request-body timeout.
pub type ReqBody = crate::metrics::Counted<crate::fair::Watched<hyper::body::Incoming>>;

/// `b`, whole.
pub fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never: Infallible| match never {}).boxed()
}

/// The waypoint's own answer: `status` with `body` as plain text.
pub fn text(status: u16, body: String) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}
