//! Durations written the way fortio (Go) writes them: `50ms`, `1.5s`, `1m30s`.

use std::time::Duration;

/// Parses a Go-style duration: one or more `<decimal><unit>` terms with unit
/// `ns`, `us` (or `µs`), `ms`, `s`, `m` or `h`; a lone `0` is also accepted.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration (use e.g. 50ms or 1s)".to_owned());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration (use e.g. 50ms or 1s)"))?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("{text:?} has no unit (use e.g. 50ms or 1s)")),
            other => return Err(format!("{text:?} has unknown unit {other:?} (use ns, us, ms, s, m or h)")),
        };
        total += value * seconds_per_unit;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_go_style_durations() {
        let cases = [
            ("0", Duration::ZERO),
            ("50ms", Duration::from_millis(50)),
            ("1s", Duration::from_secs(1)),
            ("1.5s", Duration::from_millis(1500)),
            ("250us", Duration::from_micros(250)),
            ("1m30s", Duration::from_secs(90)),
            ("10ns", Duration::from_nanos(10)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_durations_with_a_reason() {
        for text in ["", "50", "ms", "5x", "1..2s", "-1s", "1e400s", "99999999999999999999999h"] {
            let err = parse_duration(text).unwrap_err();
            assert!(!err.is_empty() && !err.contains('\n'), "{text}: {err}");
        }
    }
}
