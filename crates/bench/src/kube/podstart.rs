//! S1, pod start: what a pod's log says about its first answer, and the
//! figures over the pods of a repetition. Pure; `startup` runs the pods.
//!
//! A pod's time runs from the bench's clock just before its create
//! request to the timestamp the container runtime put on the line curl
//! wrote when the first request was answered (the kubelet's log API with
//! `timestamps=true`, RFC 3339 with nanoseconds).

use crate::figures::Outcome;
use std::collections::BTreeMap;

/// Nanoseconds since the Unix epoch of an RFC 3339 time
/// (`2026-11-28T10:35:21.123456789Z`, or with a `+hh:mm` offset).
pub fn parse_rfc3339_ns(s: &str) -> Option<i128> {
    let (date, rest) = s.split_once(['T', 't'])?;
    let mut d = date.splitn(3, '-');
    let (y, m, day): (i64, i64, i64) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    let (clock, offset_s) = split_offset(rest)?;
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.splitn(3, ':');
    let (h, mi, sec): (i64, i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 || frac.len() > 9 {
        return None;
    }
    if !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nanos: i128 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().ok()? };
    let secs = days_from_civil(y, m, day) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(secs as i128 * 1_000_000_000 + nanos)
}

/// `10:35:21.5Z` -> (`10:35:21.5`, 0); `10:35:21+01:00` -> (.., 3600).
fn split_offset(rest: &str) -> Option<(&str, i64)> {
    if let Some(c) = rest.strip_suffix(['Z', 'z']) {
        return Some((c, 0));
    }
    let i = rest.rfind(['+', '-'])?;
    let (c, off) = rest.split_at(i);
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let (oh, om) = off[1..].split_once(':')?;
    Some((c, sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)))
}

/// Howard Hinnant's days_from_civil.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A pod's first answer, from its log with timestamps.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// When the runtime received curl's line (ns since the epoch).
    pub at_ns: i128,
    /// When it received the container's first line, `started`.
    pub started_ns: Option<i128>,
    /// Requests that were not answered before it.
    pub failed_attempts: u32,
}

/// The first `served 2xx` line of a log read with `timestamps=true`.
pub fn first_answer(log: &str) -> Result<Answer, String> {
    let mut failed_attempts = 0;
    let mut started_ns = None;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let (ts, text) = line.split_once(' ').ok_or_else(|| format!("a log line without a timestamp: {line:?}"))?;
        let at = || parse_rfc3339_ns(ts).ok_or_else(|| format!("not an RFC 3339 timestamp: {ts:?}"));
        if text.trim() == "started" && started_ns.is_none() {
            started_ns = Some(at()?);
        }
        let Some(code) = text.trim().strip_prefix("served ") else { continue };
        if code.starts_with('2') && code.len() == 3 {
            return Ok(Answer { at_ns: at()?, started_ns, failed_attempts });
        }
        failed_attempts += 1;
    }
    Err(format!("no answered request in the pod's log ({failed_attempts} unanswered)"))
}

/// Nearest-rank percentile of sorted values (`q` in 0..=100).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One pod's times (ms from its create request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodTimes {
    /// To its first answer: the figure.
    pub answered_ms: f64,
    /// To its container's first line (sandbox, CNI, image, start).
    pub started_ms: Option<f64>,
}

/// A repetition's figures: p50 and p99 of the pods' times (ms), with the
/// others in the details, and where the time went: p50 of creation to the
/// container running, and of that to the first answer. Pods that failed
/// are left out with a warning; no pod at all is no result.
pub fn outcome(pods: &[PodTimes], failures: &[String], retried: u32) -> Result<Outcome, String> {
    let mut o = outcome_of(&pods.iter().map(|p| p.answered_ms).collect::<Vec<_>>(), failures, retried)?;
    let mut started: Vec<f64> = pods.iter().filter_map(|p| p.started_ms).collect();
    let mut serving: Vec<f64> = pods.iter().filter_map(|p| Some(p.answered_ms - p.started_ms?)).collect();
    for v in [&mut started, &mut serving] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    for (k, v) in [("started_p50_ms", &started), ("first_request_p50_ms", &serving)] {
        if let Some(x) = percentile(v, 50.0) {
            o.details.insert(k.into(), x);
        }
    }
    Ok(o)
}

fn outcome_of(times_ms: &[f64], failures: &[String], retried: u32) -> Result<Outcome, String> {
    let mut v: Vec<f64> = times_ms.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let first = failures.first().map(|e| format!("; first: {e}")).unwrap_or_default();
    let (Some(p50), Some(p99)) = (percentile(&v, 50.0), percentile(&v, 99.0)) else {
        return Err(format!("no pod was answered ({} failed{first})", failures.len()));
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let figures: BTreeMap<String, f64> = [("p50_ms", p50), ("p99_ms", p99)].into_iter().map(|(k, x)| (k.into(), x)).collect();
    let details: BTreeMap<String, f64> = [
        ("pods", v.len() as f64),
        ("failed", failures.len() as f64),
        ("min_ms", v[0]),
        ("max_ms", v[v.len() - 1]),
        ("mean_ms", mean),
        ("unanswered_requests", retried as f64),
    ]
    .into_iter()
    .map(|(k, x)| (k.into(), x))
    .collect();
    let warnings =
        if failures.is_empty() { vec![] } else { vec![format!("{} of {} pods failed{first}", failures.len(), failures.len() + v.len())] };
    Ok(Outcome { figures, details, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        let table: &[(&str, Option<i128>)] = &[
            ("1970-01-01T00:00:00Z", Some(0)),
            ("1970-01-01T00:00:01.5Z", Some(1_500_000_000)),
            ("2026-11-28T10:35:21Z", Some(1_795_862_121_000_000_000)),
            ("2026-11-28T10:35:21.123456789Z", Some(1_795_862_121_123_456_789)),
            ("2026-11-28T11:35:21.000000001+01:00", Some(1_795_862_121_000_000_001)),
            ("2026-11-28T09:35:21-01:00", Some(1_795_862_121_000_000_000)),
            ("2000-02-29T00:00:00Z", Some(951_782_400_000_000_000)),
            ("2026-13-01T00:00:00Z", None),
            ("2026-11-28 10:35:21Z", None),
            ("2026-11-28T10:35:21.1234567890Z", None),
            ("2026-11-28T10:35:21", None),
        ];
        for (s, want) in table {
            assert_eq!(parse_rfc3339_ns(s), *want, "{s}");
        }
        // Agrees with the report's own formatting.
        let secs = parse_rfc3339_ns("2026-11-28T10:35:21Z").unwrap() / 1_000_000_000;
        assert_eq!(crate::timefmt::civil(secs as u64), (2026, 11, 28, 10, 35, 21));
    }

    #[test]
    fn first_answer_skips_unanswered_attempts() {
        let log = "2026-11-28T10:35:21.100000000Z served 000\n\
                   2026-11-28T10:35:21.200000000Z served 503\n\
                   2026-11-28T10:35:21.250000000Z served 200\n\
                   2026-11-28T10:35:21.300000000Z served 200\n";
        let a = first_answer(log).unwrap();
        assert_eq!(a, Answer { at_ns: parse_rfc3339_ns("2026-11-28T10:35:21.25Z").unwrap(), started_ns: None, failed_attempts: 2 });
        let started = first_answer("2026-11-28T10:35:21.01Z started\n2026-11-28T10:35:21.5Z served 200\n").unwrap();
        assert_eq!(started.started_ns, parse_rfc3339_ns("2026-11-28T10:35:21.01Z"));
        assert_eq!(first_answer("2026-11-28T10:35:21Z served 200").unwrap().failed_attempts, 0);
        assert_eq!(first_answer("2026-11-28T10:35:21Z served 000\n").unwrap_err(), "no answered request in the pod's log (1 unanswered)");
        assert!(first_answer("").is_err());
        assert!(first_answer("yesterday served 200").unwrap_err().contains("not an RFC 3339"));
        assert_eq!(
            first_answer("2026-11-28T10:35:21Z curl: (6) Could not resolve\n2026-11-28T10:35:22Z served 204").unwrap().failed_attempts,
            0
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=50).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(25.0));
        assert_eq!(percentile(&v, 99.0), Some(50.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let h: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&h, 99.0), Some(99.0));
    }

    #[test]
    fn outcome_over_the_pods() {
        let p = |answered_ms, started_ms| PodTimes { answered_ms, started_ms };
        let o = outcome(&[p(300.0, Some(250.0)), p(100.0, Some(40.0)), p(200.0, None)], &[], 4).unwrap();
        assert_eq!((o.details["started_p50_ms"], o.details["first_request_p50_ms"]), (40.0, 50.0));
        let o = outcome(&[p(300.0, None), p(100.0, None), p(200.0, None)], &[], 4).unwrap();
        assert!(!o.details.contains_key("started_p50_ms"));
        assert_eq!((o.figures["p50_ms"], o.figures["p99_ms"]), (200.0, 300.0));
        assert_eq!((o.details["pods"], o.details["min_ms"], o.details["mean_ms"]), (3.0, 100.0, 200.0));
        assert_eq!(o.details["unanswered_requests"], 4.0);
        assert!(o.warnings.is_empty());
        let some = outcome(&[p(100.0, None)], &["timed out".into()], 0).unwrap();
        assert_eq!(some.warnings, ["1 of 2 pods failed; first: timed out"]);
        assert_eq!(outcome(&[], &["x".into()], 0).unwrap_err(), "no pod was answered (1 failed; first: x)");
    }
}
