//! One line per HTTP request, written when the response body is finished (or
//! abandoned), so the byte count is what was actually handed to the
//! connection, streamed bodies included.
//!
//! Format: `<client_addr> "<METHOD> <path> <version>" <status> <bytes>`.

use slipstream_core::sync::LockExt;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use super::{Body, BoxError};

/// Where access-log lines go.
#[derive(Clone, Debug, Default)]
pub enum AccessLog {
    /// No per-request lines (`--quiet`).
    #[default]
    Off,
    /// One line per request on stdout, where the pod's log collector reads it.
    Stdout,
    /// Kept in memory, for tests that check what would have been logged.
    Memory(Arc<Mutex<Vec<String>>>),
}

impl AccessLog {
    /// The sink the command-line apps use.
    pub fn stdout_unless(quiet: bool) -> Self {
        if quiet {
            AccessLog::Off
        } else {
            AccessLog::Stdout
        }
    }

    /// An in-memory sink; read it back with [`AccessLog::lines`].
    pub fn memory() -> Self {
        AccessLog::Memory(Arc::default())
    }

    /// The lines recorded by a [`AccessLog::Memory`] sink (empty otherwise).
    pub fn lines(&self) -> Vec<String> {
        match self {
            AccessLog::Memory(lines) => lines.locked().clone(),
            _ => Vec::new(),
        }
    }

    fn write(&self, line: String) {
        match self {
            AccessLog::Off => {}
            // A closed stdout must not take the server down: `println!` would
            // panic on EPIPE, so the error is ignored instead.
            AccessLog::Stdout => {
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
            AccessLog::Memory(lines) => lines.locked().push(line),
        }
    }

    /// Attaches the log entry for `req` to its response; the line is written
    /// when hyper drops the body.
    pub(crate) fn wrap(&self, line: RequestLine, resp: Response<Body>) -> Response<LoggedBody> {
        let status = resp.status().as_u16();
        let entry = match self {
            AccessLog::Off => None,
            sink => Some(Entry { sink: sink.clone(), line, status, bytes: 0 }),
        };
        resp.map(|inner| LoggedBody { inner, entry })
    }
}

/// What the access log needs from a request, captured before the handler
/// consumes it.
#[derive(Debug, Clone)]
pub(crate) struct RequestLine {
    client: SocketAddr,
    method: String,
    path: String,
    version: http::Version,
}

impl RequestLine {
    pub(crate) fn of<B>(client: SocketAddr, req: &Request<B>) -> Self {
        let path = req.uri().path_and_query().map_or_else(|| req.uri().path().to_owned(), |pq| pq.to_string());
        RequestLine { client, method: req.method().to_string(), path, version: req.version() }
    }
}

struct Entry {
    sink: AccessLog,
    line: RequestLine,
    status: u16,
    bytes: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let line = format_line(&self.line, self.status, self.bytes);
        self.sink.write(line);
    }
}

fn format_line(req: &RequestLine, status: u16, bytes: u64) -> String {
    format!("{} \"{} {} {:?}\" {} {}", req.client, req.method, req.path, req.version, status, bytes)
}

/// A response body that counts the bytes it yields for the access log.
pub struct LoggedBody {
    inner: Body,
    entry: Option<Entry>,
}

impl HttpBody for LoggedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(entry)) = (&polled, this.entry.as_mut()) {
            if let Some(data) = frame.data_ref() {
                entry.bytes += data.len() as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn line() -> RequestLine {
        let req = Request::post("/echo?size=3").body(()).unwrap();
        RequestLine::of("10.0.0.7:41234".parse().unwrap(), &req)
    }

    #[test]
    fn line_format_matches_the_documented_one() {
        assert_eq!(format_line(&line(), 200, 3), r#"10.0.0.7:41234 "POST /echo?size=3 HTTP/1.1" 200 3"#);
    }

    #[tokio::test]
    async fn line_is_written_with_the_bytes_sent_once_the_body_is_done() {
        let log = AccessLog::memory();
        let resp = crate::http::text(http::StatusCode::OK, "abc");
        let resp = log.wrap(line(), resp);
        assert!(log.lines().is_empty(), "nothing is logged before the body is finished");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"abc\n");
        assert_eq!(log.lines(), vec![r#"10.0.0.7:41234 "POST /echo?size=3 HTTP/1.1" 200 4"#.to_owned()]);
    }
}
