//! Durations written the way fortio (Go) writes them: `50ms`, `1.5s`, `1m30s`.

use std::time::Duration;

/// Go's duration units.
const UNITS: [&str; 7] = ["ns", "us", "µs", "ms", "s", "m", "h"];

/// Parses a Go-style duration: one or more `<decimal><unit>` terms with unit
/// `ns`, `us` (or `µs`), `ms`, `s`, `m` or `h`; a lone `0` is also accepted.
/// The form is checked here (humantime alone would also take `2 min` or
/// `1day`, and not `.5s`); humantime computes the value exactly, refusing
/// what overflows and what it cannot represent (a fraction of a nanosecond,
/// a fraction of an hour that is not whole seconds) rather than rounding.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration (use e.g. 50ms or 1s)".to_owned());
    }
    let mut terms = String::with_capacity(text.len() + 1);
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let number = humantime_decimal(number).ok_or_else(|| format!("{text:?} is not a duration (use e.g. 50ms or 1s)"))?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        match unit {
            "" => return Err(format!("{text:?} has no unit (use e.g. 50ms or 1s)")),
            unit if UNITS.contains(&unit) => {}
            other => return Err(format!("{text:?} has unknown unit {other:?} (use ns, us, ms, s, m or h)")),
        }
        terms.push_str(&number);
        terms.push_str(unit);
        rest = tail;
    }
    humantime::parse_duration(&terms).map_err(|e| format!("{text:?}: {e}"))
}

/// A decimal written with digits and at most one dot (`5`, `1.5`, `.5`,
/// `5.`) as humantime reads one (`5`, `1.5`, `0.5`, `5`; trailing zeros of
/// the fraction dropped, which humantime counts against its precision);
/// None for anything else (pure).
fn humantime_decimal(num: &str) -> Option<String> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || !(int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())) {
        return None;
    }
    let int = if int.is_empty() { "0" } else { int };
    Some(match frac.trim_end_matches('0') {
        "" => int.to_owned(),
        frac => format!("{int}.{frac}"),
    })
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
            ("250µs", Duration::from_micros(250)),
            ("1m30s", Duration::from_secs(90)),
            ("1h2m3s4ms5us6ns", Duration::new(3723, 4_005_006)),
            ("10ns", Duration::from_nanos(10)),
            ("0s", Duration::ZERO),
            ("0.5m", Duration::from_secs(30)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("5.s", Duration::from_secs(5)),
            ("1.5s.5s", Duration::from_secs(2)),
            ("2.500000000000ms", Duration::from_micros(2500)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_durations_with_a_reason() {
        let cases = [
            ("", "empty"),
            ("50", "no unit"),
            ("1s5", "no unit"),
            ("ms", "not a duration"),
            (".s", "not a duration"),
            ("1..2s", "not a duration"),
            ("-1s", "not a duration"),
            ("+1s", "not a duration"),
            (" 1s", "not a duration"),
            ("1 s", "unknown unit"),
            ("5x", "unknown unit"),
            ("1d", "unknown unit"),
            ("2min", "unknown unit"),
            ("1e400s", "unknown unit"),
            ("99999999999999999999999h", "too large"),
            // Not rounded: refused.
            ("1.5ns", "precision"),
            ("0.0000000001s", "precision"),
            ("0.001h", "precision"),
        ];
        for (text, why) in cases {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(why) && !err.contains('\n'), "{text}: {err}");
        }
    }
}
