//! W3C trace context (`traceparent`): a request that comes with a valid
//! one keeps its trace, with the waypoint's own span as the new parent; a
//! request without one (or with one that does not parse) starts a trace.
//! Pure; the random ids are the caller's.

/// The header.
pub const TRACEPARENT: &str = "traceparent";

/// `00-<32 hex>-<16 hex>-<2 hex>`.
const LEN: usize = 55;

/// What the waypoint sends on, and the trace id for its access log: the
/// header's bytes, made without formatting or allocation (they are per
/// request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    header: [u8; LEN],
    /// The request came with a trace (false: this one was started).
    pub propagated: bool,
}

impl Next {
    /// The `traceparent` value to send.
    pub fn header(&self) -> &str {
        std::str::from_utf8(&self.header).expect("hex and dashes")
    }

    /// Its trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        &self.header()[3..35]
    }
}

/// `v`'s last `out.len()` hex digits, lower case, into `out`.
pub(crate) fn put_hex(out: &mut [u8], mut v: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in out.iter_mut().rev() {
        *b = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

fn header(trace: [u8; 32], span: u64, flags: [u8; 2]) -> [u8; LEN] {
    let mut h = [b'-'; LEN];
    h[..2].copy_from_slice(b"00");
    h[3..35].copy_from_slice(&trace);
    put_hex(&mut h[36..52], u128::from(span));
    h[53..].copy_from_slice(&flags);
    h
}

fn hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `version-traceid-parentid-flags`, as the W3C recommendation reads it:
/// lower-case hex; version `ff` invalid; version 00 exactly four fields;
/// a later version may add fields after the flags; all-zero ids invalid.
pub fn parse(v: &str) -> Option<(&str, &str, &str)> {
    let mut parts = v.split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if !hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) {
        return None;
    }
    if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
        return None;
    }
    Some((trace, parent, flags))
}

/// The `traceparent` to send: the incoming trace with `span` as parent, or
/// a new trace `new_trace` (not sampled: the waypoint records no spans,
/// so it does not ask others to).
pub fn next(incoming: Option<&str>, span: u64, new_trace: u128) -> Next {
    let span = span.max(1);
    let continued = incoming
        .and_then(parse)
        .and_then(|(trace, _, flags)| Some((<[u8; 32]>::try_from(trace.as_bytes()).ok()?, <[u8; 2]>::try_from(flags.as_bytes()).ok()?)));
    match continued {
        Some((trace, flags)) => Next { header: header(trace, span, flags), propagated: true },
        None => {
            let mut trace = [0u8; 32];
            put_hex(&mut trace, new_trace.max(1));
            Next { header: header(trace, span, *b"00"), propagated: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_trace_is_continued_with_the_waypoints_span() {
        let n = next(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0xabc, 7);
        assert_eq!(n.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000abc-01");
        assert_eq!(n.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(n.propagated);
        // A later version with more fields: read as version 00.
        let n = next(Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra"), 1, 7);
        assert!(n.propagated);
        assert_eq!(n.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-00");
    }

    #[test]
    fn anything_else_starts_a_trace() {
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            let n = next(Some(bad), 2, 0x1234);
            assert!(!n.propagated, "{bad:?}");
            assert_eq!(n.header(), "00-00000000000000000000000000001234-0000000000000002-00", "{bad:?}");
        }
        assert!(parse(next(None, 0, 0).header()).is_some(), "even zero draws give a valid header");
    }
}
