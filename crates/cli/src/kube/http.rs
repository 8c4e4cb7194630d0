//! One HTTP/1.1 GET over a byte stream (a pod port-forward): the request
//! written by hand, the answer read to the end (`Connection: close`) and
//! parsed here, pure, for tests: status, and the body by `Content-Length`,
//! chunked encoding, or the end of the stream.

/// The request: `Connection: close`, so the answer ends with the stream.
pub fn request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slipstream-cli\r\nAccept: */*\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The stream ended before the headers did.
    NoHeaders,
    /// The status line is not `HTTP/1.x CODE ...`.
    BadStatus(String),
    /// The chunked body is malformed or cut short.
    BadChunks,
    /// Fewer bytes than `Content-Length` said.
    Short { want: usize, got: usize },
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::NoHeaders => write!(f, "the answer ended before its headers did"),
            HttpError::BadStatus(l) => write!(f, "not an HTTP status line: {l:?}"),
            HttpError::BadChunks => write!(f, "a malformed chunked body"),
            HttpError::Short { want, got } => write!(f, "the body was cut short ({got} of {want} bytes)"),
        }
    }
}

impl std::error::Error for HttpError {}

/// The status code and body of a whole answer.
pub fn parse(raw: &[u8]) -> Result<(u16, Vec<u8>), HttpError> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or(HttpError::NoHeaders)?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut words = status_line.split_whitespace();
    let code = match (words.next(), words.next().and_then(|c| c.parse::<u16>().ok())) {
        (Some(v), Some(c)) if v.starts_with("HTTP/1.") => c,
        _ => return Err(HttpError::BadStatus(status_line.to_string())),
    };
    let header = |name: &str| {
        head.split("\r\n")
            .skip(1)
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
    };
    if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Ok((code, dechunk(body)?));
    }
    match header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if body.len() < n => Err(HttpError::Short { want: n, got: body.len() }),
        Some(n) => Ok((code, body[..n].to_vec())),
        None => Ok((code, body.to_vec())),
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n").ok_or(HttpError::BadChunks)?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).map_err(|_| HttpError::BadChunks)?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err(HttpError::BadChunks);
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let ok = |code: u16, body: &str| Ok((code, body.as_bytes().to_vec()));
        type Answer = Result<(u16, Vec<u8>), HttpError>;
        let cases: &[(&str, Answer)] = &[
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", ok(200, "hello")),
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhello", ok(200, "he")),
            ("HTTP/1.1 503 Service Unavailable\r\n\r\nnot ready\n", ok(503, "not ready\n")),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n", ok(200, "hello world")),
            ("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello", Err(HttpError::Short { want: 9, got: 5 })),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nhel", Err(HttpError::BadChunks)),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5", Err(HttpError::NoHeaders)),
            ("SSH-2.0-OpenSSH\r\n\r\n", Err(HttpError::BadStatus("SSH-2.0-OpenSSH".into()))),
        ];
        for (raw, want) in cases {
            assert_eq!(&parse(raw.as_bytes()), want, "{raw:?}");
        }
    }

    #[test]
    fn the_request_closes() {
        let r = String::from_utf8(request("/config_dump")).unwrap();
        assert!(r.starts_with("GET /config_dump HTTP/1.1\r\n") && r.contains("Connection: close\r\n") && r.ends_with("\r\n\r\n"));
    }
}
