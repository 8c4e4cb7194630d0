//! Routing and answers of the echo HTTP server.

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::params::EchoParams;
use super::payload::Payload;
use crate::http::{json, text, Body, ConnInfo};

const SERVED_BY: HeaderName = HeaderName::from_static("x-served-by");

/// The echo server's state: just its name, shared by every connection.
pub(crate) struct Echo {
    name: String,
    /// `x-served-by` on every answer, so load tests through the mesh can see
    /// which backend answered without parsing bodies. `None` when the name is
    /// not a valid header value.
    served_by: Option<HeaderValue>,
}

impl Echo {
    pub(crate) fn new(name: String) -> Self {
        let served_by = HeaderValue::from_str(&name).ok();
        Echo { name, served_by }
    }

    pub(crate) async fn handle(&self, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let mut resp = self.route(req, conn).await;
        if let Some(served_by) = &self.served_by {
            resp.headers_mut().insert(SERVED_BY, served_by.clone());
        }
        resp
    }

    async fn route(&self, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let read_only = matches!(*req.method(), Method::GET | Method::HEAD);
        match req.uri().path() {
            // Any method: fortio's client may POST, and PUT is handy with curl.
            "/echo" => echo(req).await,
            "/headers" if read_only => json(StatusCode::OK, &self.headers(&req, conn)),
            "/healthz" if read_only => text(StatusCode::OK, "ok"),
            "/" if read_only => text(
                StatusCode::OK,
                format!("slipstream echo server {:?}: /echo?size=N&status=CODE&delay=DURATION, /headers, /healthz", self.name),
            ),
            "/headers" | "/healthz" | "/" => text(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed here; use GET", req.method())),
            path => text(StatusCode::NOT_FOUND, format!("no such path {path:?}; try /, /echo, /headers or /healthz")),
        }
    }

    /// The request as the server saw it, including the TCP peer address.
    fn headers<B>(&self, req: &Request<B>, conn: ConnInfo) -> Value {
        let mut headers = Map::new();
        for name in req.headers().keys() {
            let mut values: Vec<Value> =
                req.headers().get_all(name).iter().map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
            let value = if values.len() == 1 { values.remove(0) } else { Value::Array(values) };
            headers.insert(name.as_str().to_owned(), value);
        }
        json!({
            "server": self.name,
            "client_addr": conn.peer.to_string(),
            "local_addr": conn.local.to_string(),
            "method": req.method().as_str(),
            "path": req.uri().path(),
            "query": req.uri().query(),
            "version": format!("{:?}", req.version()),
            "headers": headers,
        })
    }
}

/// `/echo`: a payload of `size` bytes, or the request body streamed back.
async fn echo(req: Request<Incoming>) -> Response<Body> {
    let params = match EchoParams::parse(req.uri().query()) {
        Ok(params) => params,
        Err(err) => return text(StatusCode::BAD_REQUEST, err.to_string()),
    };
    if !params.delay.is_zero() {
        tokio::time::sleep(params.delay).await;
    }
    let status = params.status.pick(&mut rand::thread_rng());
    let (parts, body) = req.into_parts();
    let (body, content_type) = match params.size {
        Some(size) => (Payload::new(size).boxed(), Some(HeaderValue::from_static("text/plain"))),
        // Streamed, not collected: memory stays bounded whatever the size,
        // and flow control pushes back on a client that does not read.
        None => (body.map_err(Into::into).boxed(), parts.headers.get(CONTENT_TYPE).cloned()),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Some(content_type) = content_type {
        resp.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    resp
}
