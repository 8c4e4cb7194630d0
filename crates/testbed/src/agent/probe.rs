//! HTTP readiness probes, as the kubelet makes them: of containers
//! (`readinessProbe.httpGet`) and of the node proxies (`/healthz/ready`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Why a probe failed: the server answered "not ready" (it is alive), or
/// it did not answer properly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// An HTTP answer outside 2xx/3xx, with the first line of its body.
    NotReady {
        status: u16,
        message: String,
    },
    NoAnswer(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotReady { message, .. } | Self::NoAnswer(message) => f.write_str(message),
        }
    }
}

/// One HTTP readiness probe: Ok for a 2xx/3xx answer within `timeout`.
pub fn http_ready(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(), ProbeError> {
    let no_answer = ProbeError::NoAnswer;
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| no_answer(format!("connecting to {addr}: {}", io_reason(&e, timeout))))?;
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\nUser-Agent: slipstream-probe\r\n\r\n", addr.ip());
    s.write_all(req.as_bytes()).map_err(|e| no_answer(format!("sending to {addr}: {}", io_reason(&e, timeout))))?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).map_err(|e| no_answer(format!("no answer from {addr}{path}: {}", io_reason(&e, timeout))))?;
    let answer = String::from_utf8_lossy(&buf[..n]);
    match answer.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()) {
        Some(c) if (200..400).contains(&c) => Ok(()),
        Some(status) => {
            // The body's first line says why (the node proxy lists its reasons).
            let why = answer.split_once("\r\n\r\n").and_then(|(_, b)| b.lines().next()).filter(|l| !l.is_empty());
            let message = match why {
                Some(w) => format!("{addr}{path} answered HTTP {status}: {w}"),
                None => format!("{addr}{path} answered HTTP {status}"),
            };
            Err(ProbeError::NotReady { status, message })
        }
        None if n == 0 => Err(no_answer(format!("{addr}{path} closed the connection without answering"))),
        None => Err(no_answer(format!("{addr}{path} answered something that is not HTTP"))),
    }
}

/// One HTTP GET for tools (`proxy-status`, `proxy-config`): the status
/// code and the body (at most `max` bytes), or why there was none.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration, max: usize) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connecting to {addr}: {}", io_reason(&e, timeout)))?;
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\nUser-Agent: slipstream-cli\r\n\r\n", addr.ip());
    s.write_all(req.as_bytes()).map_err(|e| format!("sending to {addr}: {}", io_reason(&e, timeout)))?;
    let mut buf = Vec::new();
    s.take(max as u64 + 1).read_to_end(&mut buf).map_err(|e| format!("reading from {addr}{path}: {}", io_reason(&e, timeout)))?;
    if buf.len() > max {
        return Err(format!("{addr}{path}: the answer is larger than {max} bytes"));
    }
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{addr}{path} answered something that is not HTTP"))?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).ok_or_else(|| format!("{addr}{path}: no HTTP status"))?;
    Ok((code, body.to_string()))
}

fn io_reason(e: &std::io::Error, timeout: Duration) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!("timed out after {timeout:?}"),
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_probe_answers() {
        use std::net::TcpListener;
        let serve = |answer: &'static [u8]| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 256];
                let _ = c.read(&mut buf);
                let _ = c.write_all(answer);
            });
            addr
        };
        let t = Duration::from_secs(1);
        assert_eq!(http_ready(serve(b"HTTP/1.1 200 OK\r\n\r\nready\n"), "/healthz/ready", t), Ok(()));
        let e = http_ready(serve(b"HTTP/1.1 503 Service Unavailable\r\n\r\n"), "/healthz/ready", t).unwrap_err();
        assert!(matches!(e, ProbeError::NotReady { status: 503, .. }), "{e}");
        assert!(e.to_string().ends_with("/healthz/ready answered HTTP 503"), "{e}");
        let e =
            http_ready(serve(b"HTTP/1.1 503 Service Unavailable\r\n\r\npod x: listeners not bound\n"), "/healthz/ready", t).unwrap_err();
        assert!(e.to_string().ends_with("/healthz/ready answered HTTP 503: pod x: listeners not bound"), "{e}");
        // Accepted by the kernel but never answered (a stopped process).
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = http_ready(l.local_addr().unwrap(), "/healthz/ready", Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ProbeError::NoAnswer(_)));
        let e = e.to_string();
        assert!(e.starts_with("no answer from ") && e.ends_with("timed out after 200ms"), "{e}");
        let addr = l.local_addr().unwrap();
        drop(l);
        let e = http_ready(addr, "/", t).unwrap_err().to_string();
        assert!(e.ends_with("connection refused"), "{e}");
    }
}
