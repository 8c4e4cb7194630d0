//! The mesh's one duration parser, for the three forms users write:
//!
//! - [`parse_flag`]: a command-line flag or environment variable
//!   (`--timeout 30s`): one number, integer or decimal, with unit `ms`,
//!   `s`, `m` or `h`, or none for seconds (`3` is `3s`); or several terms
//!   in those units, as Go writes them (`1m30s`);
//! - [`parse_go`]: Go's `time.ParseDuration`, as Istio's CRDs and fortio
//!   take it (`1.5s`, `1m30s`, `500ms`, `0`);
//! - [`parse_gateway_api`]: Gateway API's GEP-2257 (`10s`, `1h30m`):
//!   one to four pairs of a whole number of up to five digits and a unit
//!   `h`, `m`, `s` or `ms`.
//!
//! The form is checked here; humantime computes the value exactly,
//! refusing what overflows and what it cannot represent (a fraction of a
//! nanosecond, a fraction of an hour that is not whole seconds) rather
//! than rounding. Errors say what was wrong with an example of what is
//! right; callers add the field or flag.

use std::time::Duration;

/// Go's units.
const GO_UNITS: [&str; 7] = ["ns", "us", "µs", "ms", "s", "m", "h"];

/// A flag's duration: `30s`, `2m`, `500ms`, `1.5h`, `3` (seconds), or
/// several terms in those units (`1m30s`).
#[allow(clippy::disallowed_methods)] // The one home of humantime's parser.
pub fn parse_flag(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let num = decimal(num).ok_or_else(|| format!("{s:?} is not a duration (examples: 30s, 2m, 500ms)"))?;
    let unit = match unit {
        "" => "s",
        "ms" | "s" | "m" | "h" => unit,
        // Several terms in those units, as Go and Istio write them
        // (`1m30s`, `1h30m`).
        _ if go_terms_in(s, &["ms", "s", "m", "h"]) => return parse_go(s),
        _ => return Err(format!("{s:?} is not a duration: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    humantime::parse_duration(&format!("{num}{unit}")).map_err(|e| format!("{s:?} is not a duration: {e}"))
}

/// A duration as Go's `time.ParseDuration` reads it: one or more
/// `<decimal><unit>` terms with unit `ns`, `us` (or `µs`), `ms`, `s`, `m`
/// or `h`; a lone `0` is zero.
#[allow(clippy::disallowed_methods)] // The one home of humantime's parser.
pub fn parse_go(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("\"\" is not a duration: empty (use e.g. 50ms or 1s)".to_owned());
    }
    let mut terms = String::with_capacity(text.len() + 1);
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let number = decimal(number).ok_or_else(|| format!("{text:?} is not a duration (use e.g. 50ms or 1s)"))?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        match unit {
            "" => return Err(format!("{text:?} is not a duration: no unit (use e.g. 50ms or 1s)")),
            unit if GO_UNITS.contains(&unit) => {}
            other => return Err(format!("{text:?} is not a duration: unknown unit {other:?} (use ns, us, ms, s, m or h)")),
        }
        terms.push_str(&number);
        terms.push_str(unit);
        rest = tail;
    }
    humantime::parse_duration(&terms).map_err(|e| format!("{text:?} is not a duration: {e}"))
}

/// Whether `s` is one or more `<decimal><unit>` terms with every unit
/// among `units`.
fn go_terms_in(s: &str, units: &[&str]) -> bool {
    let mut rest = s;
    while !rest.is_empty() {
        let number = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let unit = rest[number..].find(|c: char| c.is_ascii_digit() || c == '.').map_or(rest.len(), |u| number + u);
        if number == 0 || !units.contains(&&rest[number..unit]) {
            return false;
        }
        rest = &rest[unit..];
    }
    !s.is_empty()
}

/// A Gateway API duration (GEP-2257).
pub fn parse_gateway_api(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("{s:?} is not a duration: 1 to 4 pairs of a number (up to 5 digits) and a unit h, m, s or ms, e.g. 10s, 1h30m, 500ms");
    let mut rest = s;
    let mut pairs = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit = rest[digits..].bytes().take_while(u8::is_ascii_alphabetic).count();
        if digits == 0 || digits > 5 || !matches!(&rest[digits..digits + unit], "h" | "m" | "s" | "ms") {
            return Err(bad());
        }
        rest = &rest[digits + unit..];
        pairs += 1;
    }
    if pairs == 0 || pairs > 4 {
        return Err(bad());
    }
    parse_go(s).map_err(|_| bad())
}

/// A decimal written with digits and at most one dot (`5`, `1.5`, `.5`,
/// `5.`) as humantime reads one (`5`, `1.5`, `0.5`, `5`; trailing zeros of
/// the fraction dropped, which humantime counts against its precision);
/// None for anything else.
fn decimal(num: &str) -> Option<String> {
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
    fn duration_flags_take_one_number_with_an_optional_unit() {
        let cases = [
            ("120s", Duration::from_secs(120)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("500ms", Duration::from_millis(500)),
            // No unit: seconds.
            ("3", Duration::from_secs(3)),
            ("0", Duration::ZERO),
            ("1.5", Duration::from_millis(1500)),
            ("1.5s", Duration::from_millis(1500)),
            ("0.25m", Duration::from_secs(15)),
            ("2.5ms", Duration::from_micros(2500)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("5.", Duration::from_secs(5)),
            ("007s", Duration::from_secs(7)),
            ("1.250000000000s", Duration::from_millis(1250)),
            // Several terms, as Go and Istio write them.
            ("1m30s", Duration::from_secs(90)),
            ("1h0.5m", Duration::from_secs(3630)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_flag(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn duration_flags_refuse_other_forms_with_a_reason() {
        let cases = [
            ("", "not a duration"),
            ("s", "not a duration"),
            (".", "not a duration"),
            ("1.2.3s", "not a duration"),
            ("-1s", "not a duration"),
            ("+1s", "not a duration"),
            (" 1s", "not a duration"),
            ("1 s", "unknown unit"),
            ("5x", "unknown unit"),
            ("2min", "unknown unit"),
            ("1d", "unknown unit"),
            ("1ns", "unknown unit"),
            ("1e3s", "unknown unit"),
            ("99999999999999999999h", "too large"),
            // Not rounded: refused.
            ("0.0000000001", "precision"),
            ("0.001h", "precision"),
        ];
        for (text, why) in cases {
            let err = parse_flag(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

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
            assert_eq!(parse_go(text), Ok(want), "{text}");
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
            let err = parse_go(text).unwrap_err();
            assert!(err.contains(why) && err.contains("is not a duration") && !err.contains('\n'), "{text}: {err}");
        }
    }

    #[test]
    fn gateway_api_durations_follow_gep_2257() {
        for (text, want) in [
            ("10s", Duration::from_secs(10)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("0s", Duration::ZERO),
            ("1h1m1s1ms", Duration::from_millis(3_661_001)),
        ] {
            assert_eq!(parse_gateway_api(text), Ok(want), "{text}");
        }
        for text in ["", "1.5s", "123456s", "1h1m1s1ms1ms", "10", "10us", "1d", "s10"] {
            assert!(parse_gateway_api(text).is_err(), "{text}");
        }
    }
}
