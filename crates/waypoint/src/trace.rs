//! W3C trace context (`traceparent`): a request that comes with a valid
//! one keeps its trace, with the waypoint's own span as the new parent; a
//! request without one (or with one that does not parse) starts a trace.
//! Pure; the random ids are the caller's.

/// The header.
pub const TRACEPARENT: &str = "traceparent";

/// What the waypoint sends on, and the trace id for its access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    pub header: String,
    pub trace_id: String,
    /// The request came with a trace (false: this one was started).
    pub propagated: bool,
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
    match incoming.and_then(parse) {
        Some((trace, _, flags)) => {
            Next { header: format!("00-{trace}-{span:016x}-{flags}"), trace_id: trace.to_string(), propagated: true }
        }
        None => {
            let trace = format!("{:032x}", new_trace.max(1));
            Next { header: format!("00-{trace}-{span:016x}-00"), trace_id: trace, propagated: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_trace_is_continued_with_the_waypoints_span() {
        let n = next(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0xabc, 7);
        assert_eq!(n.header, "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000abc-01");
        assert_eq!(n.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(n.propagated);
        // A later version with more fields: read as version 00.
        let n = next(Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra"), 1, 7);
        assert!(n.propagated);
        assert_eq!(n.header, "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-00");
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
            assert_eq!(n.header, "00-00000000000000000000000000001234-0000000000000002-00", "{bad:?}");
        }
        assert!(parse(&next(None, 0, 0).header).is_some(), "even zero draws give a valid header");
    }
}
