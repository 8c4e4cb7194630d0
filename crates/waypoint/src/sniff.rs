//! Whether a tunnel carries HTTP: the first bytes the client sends are an
//! HTTP/1 method and a space, or the HTTP/2 connection preface. Anything
//! else, or a client that sends nothing first (a protocol where the server
//! speaks first), is passed through as TCP. Pure, table-tested.

/// Methods that start an HTTP/1 request (RFC 9110 and PATCH), and `PRI`,
/// the start of the HTTP/2 preface.
const STARTS: &[&[u8]] = &[b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"CONNECT ", b"OPTIONS ", b"TRACE ", b"PATCH ", b"PRI "];

/// What the bytes seen so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Http,
    Tcp,
    /// Still a prefix of an HTTP start: read more.
    Undecided,
}

pub fn sniff(first: &[u8]) -> Sniffed {
    if first.is_empty() {
        return Sniffed::Undecided;
    }
    for s in STARTS {
        if first.starts_with(s) {
            return Sniffed::Http;
        }
    }
    if STARTS.iter().any(|s| s.starts_with(first)) {
        Sniffed::Undecided
    } else {
        Sniffed::Tcp
    }
}

/// How an HTTP/2 (prior knowledge) client starts: its preface.
pub const H2_PREFACE: &[u8] = b"PRI ";

/// The longest start: after this many bytes the answer is never undecided.
pub const MAX_SNIFF: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_starts_and_everything_else() {
        let rows: &[(&[u8], Sniffed)] = &[
            (b"GET / HTTP/1.1\r\n", Sniffed::Http),
            (b"POST /x", Sniffed::Http),
            (b"PRI * HTTP/2.0\r\n", Sniffed::Http),
            (b"OPTIONS * HTTP/1.1", Sniffed::Http),
            (b"GE", Sniffed::Undecided),
            (b"DELET", Sniffed::Undecided),
            (b"", Sniffed::Undecided),
            (b"GETX", Sniffed::Tcp),
            (b"get / HTTP/1.1", Sniffed::Tcp),
            (b"\x16\x03\x01", Sniffed::Tcp),
            (b"\x00\x00\x00\x01", Sniffed::Tcp),
            (b"SSH-2.0-OpenSSH", Sniffed::Tcp),
        ];
        for (bytes, want) in rows {
            assert_eq!(sniff(bytes), *want, "{:?}", String::from_utf8_lossy(bytes));
        }
        assert!(STARTS.iter().all(|s| s.len() <= MAX_SNIFF));
    }
}
