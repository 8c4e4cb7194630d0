//! `fortio load -json -` output (fortio 1.63): the HTTP runner's result.

use super::{json_part, ParseError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// What the bench reads from one fortio run. Times in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct FortioRun {
    pub actual_qps: f64,
    pub duration_s: f64,
    /// Requests completed (successful or not).
    pub requests: u64,
    /// Requests answered with a 2xx status.
    pub ok: u64,
    /// Requests that failed (socket errors are fortio's code -1).
    pub errors: u64,
    /// TCP connections opened.
    pub sockets: u64,
    pub avg_ms: f64,
    /// (percentile, milliseconds), as asked with `-p`.
    pub percentiles: Vec<(f64, f64)>,
}

impl FortioRun {
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        self.percentiles.iter().find(|(q, _)| (q - p).abs() < 1e-9).map(|(_, v)| *v)
    }

    /// Successful requests per second.
    pub fn ok_per_sec(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.ok as f64 / self.duration_s
        } else {
            0.0
        }
    }

    /// Connections opened per second.
    pub fn sockets_per_sec(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.sockets as f64 / self.duration_s
        } else {
            0.0
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Raw {
    run_type: String,
    #[serde(rename = "ActualQPS")]
    actual_qps: f64,
    /// Nanoseconds.
    actual_duration: u64,
    duration_histogram: Histogram,
    #[serde(default)]
    ret_codes: BTreeMap<String, u64>,
    #[serde(default)]
    socket_count: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Histogram {
    count: u64,
    /// Seconds.
    avg: f64,
    #[serde(default)]
    percentiles: Option<Vec<Percentile>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Percentile {
    percentile: f64,
    /// Seconds.
    value: f64,
}

pub fn parse(text: &str) -> Result<FortioRun, ParseError> {
    let raw: Raw = serde_json::from_str(json_part(text)?).map_err(|e| ParseError::Json(e.to_string()))?;
    if raw.run_type != "HTTP" {
        return Err(ParseError::Invalid(format!("expected an HTTP run, got RunType {:?}", raw.run_type)));
    }
    let ok: u64 = raw.ret_codes.iter().filter(|(code, _)| code.starts_with('2') && code.len() == 3).map(|(_, n)| n).sum();
    let requests = raw.duration_histogram.count;
    Ok(FortioRun {
        actual_qps: raw.actual_qps,
        duration_s: raw.actual_duration as f64 / 1e9,
        requests,
        ok,
        errors: requests.saturating_sub(ok),
        sockets: raw.socket_count,
        avg_ms: raw.duration_histogram.avg * 1000.0,
        percentiles: raw.duration_histogram.percentiles.unwrap_or_default().into_iter().map(|p| (p.percentile, p.value * 1000.0)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn fixed_rate_run() {
        // fortio load -c 4 -qps 100 -t 2s -json (loopback, fortio 1.63.0)
        let r = parse(include_str!("../../testdata/fortio-l1.json")).unwrap();
        assert!(close(r.actual_qps, 99.92651439105961));
        assert!(close(r.duration_s, 2.001470793));
        assert_eq!((r.requests, r.ok, r.errors, r.sockets), (200, 200, 0, 4));
        assert!(close(r.avg_ms, 0.33691487999999996));
        assert!(close(r.percentile_ms(50.0).unwrap(), 0.46322036180904515));
        assert!(close(r.percentile_ms(99.9).unwrap(), 0.856759344723618));
        assert_eq!(r.percentiles.len(), 5);
        assert_eq!(r.percentile_ms(95.0), None);
    }

    #[test]
    fn max_rate_run() {
        // fortio load -c 8 -qps -1 -t 2s -p 50,90,99,99.9
        let r = parse(include_str!("../../testdata/fortio-q1.json")).unwrap();
        assert!(close(r.actual_qps, 27774.92817312841));
        assert_eq!((r.requests, r.ok, r.errors, r.sockets), (55560, 55560, 0, 8));
        assert!(close(r.ok_per_sec(), 55560.0 / 2.000365209));
        let ps: Vec<f64> = r.percentiles.iter().map(|p| p.0).collect();
        assert_eq!(ps, [50.0, 90.0, 99.0, 99.9]);
    }

    #[test]
    fn no_keepalive_counts_connections() {
        // fortio load -c 8 -qps -1 -t 2s -keepalive=false: one socket per request (+ warm-up)
        let r = parse(include_str!("../../testdata/fortio-c1.json")).unwrap();
        assert_eq!((r.requests, r.ok, r.sockets), (15097, 15097, 15105));
        assert!(close(r.sockets_per_sec(), 15105.0 / 2.000604037));
    }

    #[test]
    fn failed_requests_are_counted() {
        // /echo?status=503:30 with -allow-initial-errors
        let r = parse(include_str!("../../testdata/fortio-errors.json")).unwrap();
        assert_eq!((r.requests, r.ok, r.errors), (12191, 8484, 3707));
    }

    #[test]
    fn log_lines_around_the_json_are_ignored() {
        let text = format!("Fortio 1.63.0 running\n{}\nAll done\n", include_str!("../../testdata/fortio-q1.json"));
        assert_eq!(parse(&text).unwrap().requests, 55560);
    }

    #[test]
    fn errors_say_what_was_wrong() {
        // What fortio prints when it aborts (no server): no JSON at all.
        let e = parse("Aborting because of error -1 for http://server:8080/echo?size=1024 (0 bytes)\n").unwrap_err();
        assert!(matches!(e, ParseError::NoJson(_)));
        assert!(e.to_string().contains("Aborting because of error -1"), "{e}");
        assert!(parse("").unwrap_err().to_string().contains("empty"));
        let e = parse(r#"{"RunType": "HTTP"}"#).unwrap_err();
        assert!(e.to_string().contains("ActualQPS"), "{e}");
        let tcp = include_str!("../../testdata/fortio-q1.json").replace("\"RunType\": \"HTTP\"", "\"RunType\": \"TCP\"");
        assert!(parse(&tcp).unwrap_err().to_string().contains("HTTP run"));
    }
}
