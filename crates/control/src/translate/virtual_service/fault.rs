//! A VirtualService route's `fault`: delays and aborts, each for a share
//! of the requests.

use super::{duration, int_in, per_million, Reader};
use crate::objects::ObjectError;
use serde::Deserialize;
use slipstream_core::route::traffic::{Fault, FaultAbort, FaultDelay, MILLION};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FaultSpec {
    pub(super) delay: Option<DelaySpec>,
    pub(super) abort: Option<AbortSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DelaySpec {
    pub(super) fixed_delay: Option<String>,
    pub(super) exponential_delay: Option<String>,
    pub(super) percentage: Option<PercentSpec>,
    pub(super) percent: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AbortSpec {
    pub(super) http_status: Option<i64>,
    pub(super) grpc_status: Option<String>,
    http2_error: Option<String>,
    pub(super) percentage: Option<PercentSpec>,
}

#[derive(Deserialize)]
pub(super) struct PercentSpec {
    pub(super) value: Option<f64>,
}

pub(super) fn fault(rd: &Reader, fs: FaultSpec, f: &str) -> Result<Fault, ObjectError> {
    let delay = match fs.delay {
        None => None,
        Some(d) => {
            let g = format!("{f}.delay");
            if d.exponential_delay.is_some() {
                return Err(rd.unsupported(format!("{g}.exponentialDelay"), "use fixedDelay"));
            }
            let Some(fixed) = d.fixed_delay else { return Err(rd.err(format!("{g}.fixedDelay"), "required")) };
            let delay = duration(|m| rd.err(format!("{g}.fixedDelay"), m), &fixed)?
                .ok_or_else(|| rd.err(format!("{g}.fixedDelay"), "must be more than 0"))?;
            let per_million = match (d.percentage.and_then(|p| p.value), d.percent) {
                (Some(v), _) => per_million(rd, v, &format!("{g}.percentage.value"))?,
                (None, Some(p)) => per_million(rd, p as f64, &format!("{g}.percent"))?,
                // Istio: no percentage, every request.
                (None, None) => MILLION,
            };
            Some(FaultDelay { per_million, delay })
        }
    };
    let abort = match fs.abort {
        None => None,
        Some(a) => {
            let g = format!("{f}.abort");
            for (field, set) in [("grpcStatus", a.grpc_status.is_some()), ("http2Error", a.http2_error.is_some())] {
                if set {
                    return Err(rd.unsupported(format!("{g}.{field}"), "abort with httpStatus"));
                }
            }
            let Some(status) = a.http_status else { return Err(rd.err(format!("{g}.httpStatus"), "required")) };
            let status = int_in(rd, status, 200, 599, &format!("{g}.httpStatus"))? as u16;
            let per_million = match a.percentage.and_then(|p| p.value) {
                Some(v) => per_million(rd, v, &format!("{g}.percentage.value"))?,
                None => MILLION,
            };
            Some(FaultAbort { per_million, status })
        }
    };
    if delay.is_none() && abort.is_none() {
        return Err(rd.err(f, "needs a delay or an abort"));
    }
    Ok(Fault { delay, abort })
}
