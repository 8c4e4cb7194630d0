//! UTC timestamps and durations for humans and file names. Pure.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// (year, month, day, hour, minute, second) in UTC.
pub fn civil(unix_secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, (rem / 3600) as u32, (rem % 3600 / 60) as u32, (rem % 60) as u32)
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `2026-11-22T04:18:45Z`
pub fn rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(secs(t));
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `20261122T041845Z`, for directory names.
pub fn compact(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(secs(t));
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// `9m 52s`, `1m 05s`, `42.3s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        let total = s.round() as u64;
        format!("{}m {:02}s", total / 60, total % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(civil(1_795_321_125), (2026, 11, 22, 4, 18, 45));
        let t = UNIX_EPOCH + Duration::from_secs(1_795_321_125);
        assert_eq!(rfc3339(t), "2026-11-22T04:18:45Z");
        assert_eq!(compact(t), "20261122T041845Z");
    }

    #[test]
    fn durations() {
        assert_eq!(human(Duration::from_millis(42_340)), "42.3s");
        assert_eq!(human(Duration::from_secs(592)), "9m 52s");
        assert_eq!(human(Duration::from_secs(65)), "1m 05s");
    }
}
