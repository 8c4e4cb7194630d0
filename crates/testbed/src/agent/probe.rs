//! HTTP readiness probes, as the kubelet makes them: of containers
//! (`readinessProbe.httpGet`) and of the node proxies (`/healthz/ready`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One HTTP readiness probe: Ok for a 2xx/3xx answer within `timeout`.
pub fn http_ready(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connecting to {addr}: {}", io_reason(&e, timeout)))?;
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\nUser-Agent: slipstream-probe\r\n\r\n", addr.ip());
    s.write_all(req.as_bytes()).map_err(|e| format!("sending to {addr}: {}", io_reason(&e, timeout)))?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).map_err(|e| format!("no answer from {addr}{path}: {}", io_reason(&e, timeout)))?;
    let line = String::from_utf8_lossy(&buf[..n]);
    match line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()) {
        Some(c) if (200..400).contains(&c) => Ok(()),
        Some(c) => Err(format!("{addr}{path} answered HTTP {c}")),
        None if n == 0 => Err(format!("{addr}{path} closed the connection without answering")),
        None => Err(format!("{addr}{path} answered something that is not HTTP")),
    }
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
        assert!(e.ends_with("/healthz/ready answered HTTP 503"), "{e}");
        // Accepted by the kernel but never answered (a stopped process).
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = http_ready(l.local_addr().unwrap(), "/healthz/ready", Duration::from_millis(200)).unwrap_err();
        assert!(e.starts_with("no answer from ") && e.ends_with("timed out after 200ms"), "{e}");
        let addr = l.local_addr().unwrap();
        drop(l);
        let e = http_ready(addr, "/", t).unwrap_err();
        assert!(e.ends_with("connection refused"), "{e}");
    }
}
