//! Traffic policy (load balancing, outlier detection), retries and
//! faults, both ways.

use super::{duration, duration_from, err, lower_name, per_million, ConvertError};
use crate::route as pb;
use slipstream_core::route::traffic::{
    Fault, FaultAbort, FaultDelay, HashOn, LoadBalancer, OutlierDetection, Retry, RetryOn, TrafficPolicy,
};

// ---- to the wire ----

pub(super) fn traffic_policy(t: &TrafficPolicy) -> pb::TrafficPolicy {
    use pb::load_balancer::Kind;
    pb::TrafficPolicy {
        lb: Some(pb::LoadBalancer {
            kind: Some(match &t.lb {
                LoadBalancer::LeastRequest => Kind::LeastRequest(true),
                LoadBalancer::RoundRobin => Kind::RoundRobin(true),
                LoadBalancer::Random => Kind::Random(true),
                LoadBalancer::Hash(HashOn::Header(h)) => Kind::HashHeader(h.clone()),
                LoadBalancer::Hash(HashOn::Cookie(c)) => Kind::HashCookie(c.clone()),
                LoadBalancer::Hash(HashOn::SourceIp) => Kind::HashSourceIp(true),
                LoadBalancer::Hash(HashOn::Query(q)) => Kind::HashQuery(q.clone()),
            }),
        }),
        max_requests: t.max_requests,
        outlier: t.outlier.as_ref().map(|o| pb::OutlierDetection {
            consecutive_5xx: o.consecutive_5xx,
            consecutive_gateway: o.consecutive_gateway,
            base_ejection: Some(duration(o.base_ejection)),
            max_ejection_percent: o.max_ejection_percent,
        }),
    }
}

pub(super) fn retry(r: &Retry) -> pb::Retry {
    pb::Retry {
        attempts: r.attempts,
        per_try_timeout: r.per_try_timeout.map(duration),
        five_xx: r.on.five_xx,
        gateway_error: r.on.gateway_error,
        connect_failure: r.on.connect_failure,
        reset: r.on.reset,
        refused_stream: r.on.refused_stream,
        retriable_4xx: r.on.retriable_4xx,
        status_codes: r.on.status_codes.iter().map(|c| u32::from(*c)).collect(),
    }
}

pub(super) fn fault(f: &Fault) -> pb::Fault {
    pb::Fault {
        delay: f.delay.as_ref().map(|d| pb::FaultDelay { per_million: d.per_million, delay: Some(duration(d.delay)) }),
        abort: f.abort.as_ref().map(|a| pb::FaultAbort { per_million: a.per_million, status: a.status.into() }),
    }
}

// ---- from the wire ----

pub(super) fn traffic_from(t: &pb::TrafficPolicy, field: &str) -> Result<TrafficPolicy, ConvertError> {
    use pb::load_balancer::Kind;
    let lb = match t.lb.as_ref().and_then(|l| l.kind.as_ref()) {
        None | Some(Kind::LeastRequest(_)) => LoadBalancer::LeastRequest,
        Some(Kind::RoundRobin(_)) => LoadBalancer::RoundRobin,
        Some(Kind::Random(_)) => LoadBalancer::Random,
        Some(Kind::HashHeader(h)) => LoadBalancer::Hash(HashOn::Header(lower_name(h, &format!("{field}.lb.hash_header"))?)),
        Some(Kind::HashCookie(c)) if !c.is_empty() => LoadBalancer::Hash(HashOn::Cookie(c.clone())),
        Some(Kind::HashCookie(_)) => return Err(err(format!("{field}.lb.hash_cookie"), "required")),
        Some(Kind::HashSourceIp(_)) => LoadBalancer::Hash(HashOn::SourceIp),
        Some(Kind::HashQuery(q)) if !q.is_empty() => LoadBalancer::Hash(HashOn::Query(q.clone())),
        Some(Kind::HashQuery(_)) => return Err(err(format!("{field}.lb.hash_query"), "required")),
    };
    let outlier = match &t.outlier {
        None => None,
        Some(o) => Some(OutlierDetection {
            consecutive_5xx: o.consecutive_5xx,
            consecutive_gateway: o.consecutive_gateway,
            base_ejection: duration_from(o.base_ejection.as_ref(), &format!("{field}.outlier.base_ejection"))?.unwrap_or_default(),
            max_ejection_percent: o.max_ejection_percent.min(100),
        }),
    };
    Ok(TrafficPolicy { lb, max_requests: t.max_requests, outlier })
}

pub(super) fn retry_from(r: &pb::Retry, field: &str) -> Result<Retry, ConvertError> {
    Ok(Retry {
        attempts: r.attempts,
        per_try_timeout: duration_from(r.per_try_timeout.as_ref(), &format!("{field}.per_try_timeout"))?,
        on: RetryOn {
            five_xx: r.five_xx,
            gateway_error: r.gateway_error,
            connect_failure: r.connect_failure,
            reset: r.reset,
            refused_stream: r.refused_stream,
            retriable_4xx: r.retriable_4xx,
            status_codes: r
                .status_codes
                .iter()
                .map(|c| {
                    u16::try_from(*c)
                        .ok()
                        .filter(|c| (100..600).contains(c))
                        .ok_or_else(|| err(format!("{field}.status_codes"), format!("{c} is not an HTTP status")))
                })
                .collect::<Result<_, _>>()?,
        },
    })
}

pub(super) fn fault_from(f: &pb::Fault, field: &str) -> Result<Fault, ConvertError> {
    let delay = match &f.delay {
        None => None,
        Some(d) => Some(FaultDelay {
            per_million: per_million(d.per_million, &format!("{field}.delay.per_million"))?,
            delay: duration_from(d.delay.as_ref(), &format!("{field}.delay.delay"))?
                .ok_or_else(|| err(format!("{field}.delay.delay"), "required"))?,
        }),
    };
    let abort = match &f.abort {
        None => None,
        Some(a) => Some(FaultAbort {
            per_million: per_million(a.per_million, &format!("{field}.abort.per_million"))?,
            status: u16::try_from(a.status)
                .ok()
                .filter(|s| (200..600).contains(s))
                .ok_or_else(|| err(format!("{field}.abort.status"), format!("{} is not an HTTP status 200-599", a.status)))?,
        }),
    };
    Ok(Fault { delay, abort })
}
