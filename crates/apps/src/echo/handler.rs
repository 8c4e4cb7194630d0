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
    /// helloworld's `/hello`.
    hello_version: Option<String>,
    /// http-echo: this text for every request.
    text: Option<String>,
}

impl Echo {
    pub(crate) fn new(name: String) -> Self {
        let served_by = HeaderValue::from_str(&name).ok();
        Echo { name, served_by, hello_version: None, text: None }
    }

    pub(crate) fn with_hello(mut self, version: Option<String>) -> Self {
        self.hello_version = version;
        self
    }

    pub(crate) fn with_text(mut self, text: Option<String>) -> Self {
        self.text = text;
        self
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
        if let Some(t) = &self.text {
            return text(StatusCode::OK, format!("{t}\n"));
        }
        let path = req.uri().path().to_string();
        if let (Some(v), "/hello") = (&self.hello_version, path.as_str()) {
            return text(StatusCode::OK, format!("Hello version: {v}, instance: {}\n", self.name));
        }
        if let Some(r) = self.httpbin(&req, conn, &path).await {
            return r;
        }
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

    /// httpbin's common endpoints, for the tutorials that call them:
    /// `/get`, `/anything[/...]`, `/status/CODE`, `/delay/N` (at most 10 s),
    /// `/ip`, `/user-agent`. None for any other path.
    async fn httpbin<B>(&self, req: &Request<B>, conn: ConnInfo, path: &str) -> Option<Response<Body>> {
        let read_only = matches!(*req.method(), Method::GET | Method::HEAD);
        let host = req.headers().get(http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        let url = format!("http://{host}{}", req.uri().path_and_query().map(|p| p.as_str()).unwrap_or(path));
        let origin = conn.peer.ip().to_string();
        let args: Map<String, Value> = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), Value::String(v.to_string()))
            })
            .collect();
        let headers: Map<String, Value> = req
            .headers()
            .iter()
            .map(|(k, v)| (httpbin_case(k.as_str()), Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned())))
            .collect();
        let seg: Vec<&str> = path.trim_start_matches('/').splitn(2, '/').collect();
        Some(match (seg[0], seg.get(1)) {
            ("get", None) if read_only => json(StatusCode::OK, &json!({"args": args, "headers": headers, "origin": origin, "url": url})),
            ("anything", _) => json(
                StatusCode::OK,
                &json!({"args": args, "headers": headers, "method": req.method().as_str(), "origin": origin, "url": url}),
            ),
            ("ip", None) if read_only => json(StatusCode::OK, &json!({ "origin": origin })),
            ("user-agent", None) if read_only => json(StatusCode::OK, &json!({"user-agent": headers.get("User-Agent")})),
            ("status", Some(code)) => match code.parse::<u16>().ok().and_then(|c| StatusCode::from_u16(c).ok()) {
                Some(status) => text(status, String::new()),
                None => text(StatusCode::BAD_REQUEST, format!("invalid status code {code:?}")),
            },
            ("delay", Some(n)) if read_only => match n.parse::<f64>() {
                Ok(secs) if secs >= 0.0 => {
                    tokio::time::sleep(std::time::Duration::from_secs_f64(secs.min(10.0))).await;
                    json(StatusCode::OK, &json!({"args": args, "headers": headers, "origin": origin, "url": url}))
                }
                _ => text(StatusCode::BAD_REQUEST, format!("invalid delay {n:?}")),
            },
            _ => return None,
        })
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

/// httpbin's header names: `x-request-id` -> `X-Request-Id`.
fn httpbin_case(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}
