//! The query parameters of `/echo`, validated in one place so the handler
//! only deals with well-formed values and a bad one becomes a 400 with a
//! one-line reason.

use std::time::Duration;

use http::StatusCode;
use rand::Rng;

use slipstream_core::duration::parse_go;

/// Largest body `size` may ask for: big enough for throughput tests, small
/// enough that a typo cannot make the server stream gigabytes.
pub(crate) const MAX_SIZE: u64 = 10 * 1024 * 1024;

/// Longest `delay`: tests of timeouts need seconds, not minutes.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(10);

/// A rejected query parameter; its text is the body of the 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ParamError {
    #[error("size: {0:?} is not a byte count")]
    Size(String),
    #[error("size: {0} exceeds the cap of {MAX_SIZE} bytes")]
    SizeTooLarge(u64),
    #[error("status: {0}")]
    Status(String),
    #[error("delay: {0}")]
    Delay(String),
    #[error("delay: {0:?} exceeds the cap of 10s")]
    DelayTooLong(String),
}

/// What one `/echo` request asked for.
#[derive(Debug, PartialEq)]
pub(crate) struct EchoParams {
    /// `Some(n)`: answer exactly `n` bytes of payload; `None`: echo the body.
    pub size: Option<u64>,
    pub status: StatusPlan,
    pub delay: Duration,
}

/// The status to answer with: fixed (`status=503`), or fortio's weighted form
/// (`status=503:20,429:10` answers 503 20% of the time, 429 10%, else 200),
/// which makes retry and outlier-detection demos possible.
#[derive(Debug, PartialEq)]
pub(crate) struct StatusPlan {
    /// `(code, percent)`; the percentages add up to at most 100.
    choices: Vec<(StatusCode, f64)>,
}

impl StatusPlan {
    fn always(code: StatusCode) -> Self {
        StatusPlan { choices: vec![(code, 100.0)] }
    }

    pub(crate) fn pick(&self, rng: &mut impl Rng) -> StatusCode {
        let roll: f64 = rng.gen_range(0.0..100.0);
        let mut cumulative = 0.0;
        for &(code, percent) in &self.choices {
            cumulative += percent;
            if roll < cumulative {
                return code;
            }
        }
        StatusCode::OK
    }

    fn parse(text: &str) -> Result<Self, ParamError> {
        let bad = |why: String| ParamError::Status(why);
        let mut choices = Vec::new();
        for term in text.split(',') {
            let (code, percent) = match term.split_once(':') {
                Some((code, percent)) => {
                    let percent: f64 = percent
                        .parse()
                        .ok()
                        .filter(|p: &f64| (0.0..=100.0).contains(p))
                        .ok_or_else(|| bad(format!("{percent:?} is not a percentage between 0 and 100")))?;
                    (code, percent)
                }
                None => (term, 100.0),
            };
            let code = code
                .parse::<u16>()
                .ok()
                .filter(|c| (200..=599).contains(c))
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or_else(|| bad(format!("{code:?} is not an HTTP status code between 200 and 599")))?;
            choices.push((code, percent));
        }
        let total: f64 = choices.iter().map(|(_, p)| p).sum();
        if total > 100.0 + f64::EPSILON {
            return Err(bad(format!("percentages in {text:?} add up to {total}, more than 100")));
        }
        Ok(StatusPlan { choices })
    }
}

impl EchoParams {
    /// Parses the query string of an `/echo` request. Unknown parameters are
    /// ignored (as fortio does); a repeated one takes its last value.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, ParamError> {
        let mut params = EchoParams { size: None, status: StatusPlan::always(StatusCode::OK), delay: Duration::ZERO };
        let pairs = query.unwrap_or("").split('&').filter(|p| !p.is_empty());
        for pair in pairs {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "size" => {
                    let size: u64 = value.parse().map_err(|_| ParamError::Size(value.to_owned()))?;
                    if size > MAX_SIZE {
                        return Err(ParamError::SizeTooLarge(size));
                    }
                    params.size = Some(size);
                }
                "status" => params.status = StatusPlan::parse(value)?,
                "delay" => {
                    let delay = parse_go(value).map_err(ParamError::Delay)?;
                    if delay > MAX_DELAY {
                        return Err(ParamError::DelayTooLong(value.to_owned()));
                    }
                    params.delay = delay;
                }
                _ => {}
            }
        }
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::mock::StepRng;

    #[test]
    fn no_query_means_echo_the_body_with_200_at_once() {
        let p = EchoParams::parse(None).unwrap();
        assert_eq!(p.size, None);
        assert_eq!(p.delay, Duration::ZERO);
        assert_eq!(p.status, StatusPlan::always(StatusCode::OK));
    }

    #[test]
    fn accepted_values() {
        let p = EchoParams::parse(Some("size=1024&status=503&delay=50ms&qps=10")).unwrap();
        assert_eq!(p.size, Some(1024));
        assert_eq!(p.status, StatusPlan::always(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(p.delay, Duration::from_millis(50));
        assert_eq!(EchoParams::parse(Some("size=10485760")).unwrap().size, Some(MAX_SIZE));
        assert_eq!(EchoParams::parse(Some("delay=10s")).unwrap().delay, MAX_DELAY);
    }

    #[test]
    fn rejected_values_name_the_parameter() {
        let cases = [
            ("size=abc", "size:"),
            ("size=-1", "size:"),
            ("size=10485761", "exceeds the cap"),
            ("size=99999999999999999999999", "size:"),
            ("status=abc", "status:"),
            ("status=99", "status:"),
            ("status=600", "status:"),
            ("status=503:150", "status:"),
            ("status=503:60,429:60", "more than 100"),
            ("delay=fast", "delay:"),
            ("delay=11s", "exceeds the cap"),
        ];
        for (query, want) in cases {
            let err = EchoParams::parse(Some(query)).unwrap_err().to_string();
            assert!(err.contains(want), "{query}: {err}");
            assert!(!err.contains('\n'), "{query}: reason must be one line");
        }
    }

    #[test]
    fn weighted_status_falls_back_to_200() {
        let plan = StatusPlan::parse("503:20,429:10").unwrap();
        // StepRng(0, 0) always rolls 0.0: the first choice.
        assert_eq!(plan.pick(&mut StepRng::new(0, 0)), StatusCode::SERVICE_UNAVAILABLE);
        // u64::MAX rolls just under 100.0: past every choice.
        assert_eq!(plan.pick(&mut StepRng::new(u64::MAX, 0)), StatusCode::OK);
        let always = StatusPlan::parse("418").unwrap();
        assert_eq!(always.pick(&mut StepRng::new(u64::MAX, 0)), StatusCode::IM_A_TEAPOT);
    }
}
