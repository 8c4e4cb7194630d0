//! The access-log line of one HTTP request, written straight into the log
//! buffer ([`crate::logbuf`]).
//!
//! The line looks exactly as `tracing`'s formatter would write the event
//! (timestamp, level, target `slipstream::access`, message `request`, then
//! `name=value` fields), so tools and tests that read the log see no
//! difference; `SLIPSTREAM_LOG` still turns it off
//! (`slipstream::access=off`). Going through the formatter cost 7 % of the
//! waypoint's CPU (each field through `fmt::Debug`, the date computed
//! for every line); here the fields are appended as bytes and the date's
//! text is reused within a second (docs/waypoint.md, "Where the time goes").
//!
//! A value with a space, a quote, a backslash or a byte that is not
//! printable ASCII is written quoted and escaped (as `tracing` writes
//! strings), so a client cannot forge fields through its `Host` header.

use slipstream_core::SpiffeId;
use std::cell::Cell;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the line of one request says.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub authority: &'a str,
    pub code: u16,
    pub flags: &'a str,
    pub route: &'a str,
    pub policy: &'a str,
    pub upstream: Option<SocketAddr>,
    pub attempts: u32,
    pub duration_ms: u64,
    pub src: &'a SpiffeId,
    pub dst: Option<&'a SpiffeId>,
    pub request_id: &'a str,
    pub trace_id: &'a str,
}

/// Appends the line of `r` to the waypoint's log, unless `SLIPSTREAM_LOG`
/// filters the access log out.
pub fn write(r: &RequestLine<'_>) {
    if !enabled() {
        return;
    }
    let now = SystemTime::now();
    crate::logbuf::append(|buf| format_into(buf, now, r));
}

/// Whether the log filter lets the access log through.
fn enabled() -> bool {
    tracing::enabled!(target: slipstream_core::ACCESS_LOG_TARGET, tracing::Level::INFO)
}

/// The whole line, newline included.
pub fn format_into(buf: &mut Vec<u8>, now: SystemTime, r: &RequestLine<'_>) {
    timestamp(buf, now);
    buf.extend_from_slice(b"  INFO ");
    buf.extend_from_slice(slipstream_core::ACCESS_LOG_TARGET.as_bytes());
    buf.extend_from_slice(b": request");
    field(buf, "method", r.method);
    field(buf, "path", r.path);
    field(buf, "authority", r.authority);
    number(buf, "code", u64::from(r.code));
    // A `&str` field: `tracing` writes it quoted.
    buf.extend_from_slice(b" flags=");
    quoted(buf, r.flags);
    field(buf, "route", r.route);
    field(buf, "policy", r.policy);
    match r.upstream {
        Some(a) => {
            buf.extend_from_slice(b" upstream=");
            let _ = write!(buf, "{a}");
        }
        None => field(buf, "upstream", "-"),
    }
    number(buf, "attempts", u64::from(r.attempts));
    number(buf, "duration_ms", r.duration_ms);
    field(buf, "src", r.src.as_str());
    field(buf, "dst", r.dst.map_or("-", SpiffeId::as_str));
    field(buf, "request_id", r.request_id);
    field(buf, "trace_id", r.trace_id);
    buf.push(b'\n');
}

fn field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.push(b' ');
    buf.extend_from_slice(name.as_bytes());
    buf.push(b'=');
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\') {
        buf.extend_from_slice(value.as_bytes());
    } else {
        quoted(buf, value);
    }
}

fn quoted(buf: &mut Vec<u8>, value: &str) {
    let _ = write!(buf, "{value:?}");
}

fn number(buf: &mut Vec<u8>, name: &str, n: u64) {
    buf.push(b' ');
    buf.extend_from_slice(name.as_bytes());
    buf.push(b'=');
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

thread_local! {
    /// The second last formatted, and its `YYYY-MM-DDTHH:MM:SS` text.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// RFC 3339 in UTC with microseconds, as `tracing`'s formatter writes it:
/// `2026-11-27T09:13:45.123456Z`.
fn timestamp(buf: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let text = SECOND.with(|c| {
        let (at, text) = c.get();
        if at == secs {
            return text;
        }
        let text = civil(secs);
        c.set((secs, text));
        text
    });
    buf.extend_from_slice(&text);
    buf.push(b'.');
    let micros = since.subsec_micros();
    let mut d = [b'0'; 6];
    let mut m = micros;
    for i in (0..6).rev() {
        d[i] = b'0' + (m % 10) as u8;
        m /= 10;
    }
    buf.extend_from_slice(&d);
    buf.push(b'Z');
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time (the proleptic Gregorian calendar,
/// days to a civil date by eras of 400 years).
fn civil(secs: u64) -> [u8; 19] {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = [0u8; 19];
    let mut w = &mut out[..];
    let _ = write!(w, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::sync::LockExt;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn id(s: &str) -> SpiffeId {
        s.parse().unwrap()
    }

    #[test]
    fn dates() {
        let at = |s: u64| String::from_utf8(civil(s).to_vec()).unwrap();
        assert_eq!(at(0), "1970-01-01T00:00:00");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59");
        assert_eq!(at(1_795_770_000), "2026-11-27T09:00:00");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00");
    }

    /// A `MakeWriter` keeping what `tracing`'s formatter writes.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.locked().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Capture {
            self.clone()
        }
    }

    /// The line `tracing`'s formatter (as `slipstream waypoint` sets it
    /// up) writes for the same request: the format this module keeps.
    fn by_tracing(r: &RequestLine<'_>) -> String {
        let out = Capture::default();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(out.clone()).finish();
        let up = r.upstream.map_or("-".to_string(), |a| a.to_string());
        let dst = r.dst.map_or("-".to_string(), |d| d.to_string());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: slipstream_core::ACCESS_LOG_TARGET,
                method = %r.method,
                path = %r.path,
                authority = %r.authority,
                code = r.code,
                flags = r.flags,
                route = %r.route,
                policy = %r.policy,
                upstream = %up,
                attempts = r.attempts,
                duration_ms = r.duration_ms,
                src = %r.src,
                dst = %dst,
                request_id = %r.request_id,
                trace_id = %r.trace_id,
                "request"
            );
        });
        let v = out.0.locked().clone();
        String::from_utf8(v).unwrap()
    }

    /// A routed request's line, from `src` to `dst`.
    fn routed<'a>(src: &'a SpiffeId, dst: Option<&'a SpiffeId>) -> RequestLine<'a> {
        RequestLine {
            method: "GET",
            path: "/reviews/0",
            authority: "reviews:9080",
            code: 200,
            flags: "-",
            route: "bookinfo/reviews.0",
            policy: "-",
            upstream: Some("10.244.2.7:9080".parse().unwrap()),
            attempts: 1,
            duration_ms: 3,
            src,
            dst,
            request_id: "0123456789abcdef0123456789abcdef",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
        }
    }

    #[test]
    fn the_line_is_the_one_tracing_writes() {
        let src = id("spiffe://cluster.local/ns/bookinfo/sa/productpage");
        let dst = id("spiffe://cluster.local/ns/bookinfo/sa/reviews");
        let base = routed(&src, Some(&dst));
        let denied = RequestLine { code: 403, flags: "RBAC", policy: "production/billing", upstream: None, dst: None, attempts: 0, ..base };
        let big = RequestLine { code: 65535, attempts: u32::MAX, duration_ms: u64::MAX, ..base };
        for r in [base, denied, big] {
            let mut mine = Vec::new();
            format_into(&mut mine, SystemTime::now(), &r);
            let mine = String::from_utf8(mine).unwrap();
            let theirs = by_tracing(&r);
            // The same after the timestamp, which has the same shape.
            let (t1, rest1) = mine.split_once(' ').unwrap();
            let (t2, rest2) = theirs.split_once(' ').unwrap();
            assert_eq!(rest1, rest2);
            assert_eq!(t1.len(), t2.len(), "{t1} / {t2}");
            assert!(t1.ends_with('Z') && t1.as_bytes()[10] == b'T' && t1.as_bytes()[19] == b'.', "{t1}");
        }
    }

    #[test]
    fn slipstream_log_still_turns_it_off() {
        use tracing_subscriber::prelude::*;
        let with = |filter: &str| {
            let s = tracing_subscriber::registry().with(tracing_subscriber::EnvFilter::new(filter));
            tracing::subscriber::with_default(s, enabled)
        };
        assert!(with("info"));
        assert!(with("warn,slipstream::access=info"));
        assert!(!with("info,slipstream::access=off"));
        assert!(!with("warn"));
    }

    #[test]
    fn timestamps_within_a_second_reuse_its_text_and_keep_their_micros() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_795_770_000);
        let mut b = Vec::new();
        timestamp(&mut b, t0 + Duration::from_micros(5));
        timestamp(&mut b, t0 + Duration::from_micros(999_999));
        timestamp(&mut b, t0 + Duration::from_secs(61));
        assert_eq!(String::from_utf8(b).unwrap(), "2026-11-27T09:00:00.000005Z2026-11-27T09:00:00.999999Z2026-11-27T09:01:01.000000Z");
    }

    #[test]
    fn a_client_cannot_forge_fields() {
        let src = id("spiffe://cluster.local/ns/a/sa/b");
        let r = RequestLine { authority: "x code=500 flags=\"-\"\n", request_id: "", ..routed(&src, None) };
        let mut b = Vec::new();
        format_into(&mut b, SystemTime::now(), &r);
        let line = String::from_utf8(b).unwrap();
        assert!(line.contains(r#" authority="x code=500 flags=\"-\"\n" code=200 "#), "{line}");
        assert!(line.contains(" request_id=\"\" "), "{line}");
        assert_eq!(line.matches('\n').count(), 1, "{line}");
    }

    /// The names and labels of the waypoint's metrics and the keys of its
    /// access log, against `golden/telemetry.txt` (docs/protocols.md
    /// section 6).
    #[test]
    fn metric_names_labels_and_access_log_keys_are_the_golden_ones() {
        let m = crate::metrics::Metrics::default();
        let principal: std::sync::Arc<str> = std::sync::Arc::from("spiffe://cluster.local/ns/a/sa/b");
        for protocol in [crate::metrics::Protocol::Http, crate::metrics::Protocol::Grpc] {
            m.observe(&crate::metrics::RequestLabels::new(None, &principal, None, None, protocol, 200, "-"), 1.0, 1, 1);
        }
        let mut got = slipstream_proxy::metrics::shapes(&m.render());
        let (src, dst) = (id("spiffe://cluster.local/ns/bookinfo/sa/productpage"), id("spiffe://cluster.local/ns/bookinfo/sa/reviews"));
        let mut line = Vec::new();
        format_into(&mut line, SystemTime::now(), &routed(&src, Some(&dst)));
        let line = String::from_utf8(line).unwrap();
        for word in line.split(' ').filter(|w| w.contains('=')) {
            got.insert(format!("accesslog {}", word.split('=').next().unwrap()));
        }
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/telemetry.txt");
        slipstream_proxy::metrics::compare_golden(&golden, &got).unwrap_or_else(|e| panic!("{e}"));
    }
}
