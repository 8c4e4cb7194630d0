//! `iperf3 -c ... -J` output (iperf 3.x, TCP).

use super::{json_part, ParseError};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq)]
pub struct IperfRun {
    /// What the server received, all streams together: the figure.
    pub received_gbps: f64,
    pub sent_gbps: f64,
    pub seconds: f64,
    pub streams: usize,
    pub retransmits: Option<u64>,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    error: Option<String>,
    end: Option<End>,
}

#[derive(Deserialize)]
struct End {
    #[serde(default)]
    streams: Vec<serde_json::Value>,
    sum_sent: Option<Sum>,
    sum_received: Option<Sum>,
}

#[derive(Deserialize)]
struct Sum {
    seconds: f64,
    bits_per_second: f64,
    #[serde(default)]
    retransmits: Option<u64>,
}

/// Whether a failed run is worth retrying: iperf3's server runs one test
/// at a time and needs a moment between tests.
pub fn retryable(e: &ParseError) -> bool {
    match e {
        ParseError::Tool { message, .. } => {
            let m = message.to_ascii_lowercase();
            m.contains("busy") || m.contains("connection refused") || m.contains("unable to connect")
        }
        _ => false,
    }
}

pub fn parse(text: &str) -> Result<IperfRun, ParseError> {
    let raw: Raw = serde_json::from_str(json_part(text)?).map_err(|e| ParseError::Json(e.to_string()))?;
    if let Some(message) = raw.error {
        return Err(ParseError::Tool { tool: "iperf3", message });
    }
    let end = raw.end.ok_or_else(|| ParseError::Invalid("no \"end\" section".into()))?;
    let (Some(sent), Some(received)) = (end.sum_sent, end.sum_received) else {
        return Err(ParseError::Invalid("no \"end.sum_sent\"/\"end.sum_received\" (not a TCP test?)".into()));
    };
    Ok(IperfRun {
        received_gbps: received.bits_per_second / 1e9,
        sent_gbps: sent.bits_per_second / 1e9,
        seconds: received.seconds,
        streams: end.streams.len(),
        retransmits: sent.retransmits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream() {
        // iperf3 -c 127.0.0.1 -t 2 -J (iperf 3.12)
        let r = parse(include_str!("../../testdata/iperf3-t1.json")).unwrap();
        assert!((r.received_gbps - 22.30910309754878).abs() < 1e-9);
        assert!((r.sent_gbps - 22.3544108274045).abs() < 1e-9);
        assert_eq!(r.streams, 1);
        assert!(r.seconds > 1.9 && r.seconds < 2.1);
    }

    #[test]
    fn four_streams_are_summed() {
        // iperf3 -c 127.0.0.1 -t 2 -P 4 -J
        let r = parse(include_str!("../../testdata/iperf3-t2.json")).unwrap();
        assert_eq!(r.streams, 4);
        assert!((r.received_gbps - 21.267005099680112).abs() < 1e-9);
        assert_eq!(r.retransmits, Some(4));
    }

    #[test]
    fn a_tool_error_is_reported_and_retryable() {
        // iperf3 -c to a port nobody listens on
        let e = parse(include_str!("../../testdata/iperf3-refused.json")).unwrap_err();
        assert_eq!(e.to_string(), "iperf3 reported an error: unable to connect to server: Connection refused");
        assert!(retryable(&e));
        let busy = parse(r#"{"start": {}, "end": {}, "error": "error - the server is busy running a test. try again later"}"#).unwrap_err();
        assert!(retryable(&busy));
        assert!(!retryable(&ParseError::Invalid("x".into())));
    }

    #[test]
    fn incomplete_output_is_an_error() {
        assert!(matches!(parse(r#"{"start": {}, "end": {}}"#).unwrap_err(), ParseError::Invalid(_)));
        assert!(matches!(parse("iperf3: error - unable to connect").unwrap_err(), ParseError::NoJson(_)));
    }
}
