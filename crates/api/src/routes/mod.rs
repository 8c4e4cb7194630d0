//! The waypoint's routes (`slipstream.route.v1.ServiceRoutes`) to and from
//! the model's [`ServiceRoutes`]. To the wire: total. From the wire: a
//! field the model cannot take is an error naming it
//! (`rules[0].matches[1].path`), so the waypoint NACKs the resource.
//!
//! One module per part: route rules (`rules`: matches, filters, backends),
//! traffic policy with retries and faults (`traffic`), the L7 policies
//! (`l7`); here the resource, its rate limits and JWT rules.

mod l7;
mod rules;
#[cfg(test)]
mod tests;
mod traffic;

use crate::convert::ConvertError;
use crate::route as pb;
use prost::Message;
use slipstream_core::route::traffic::TrafficPolicy;
use slipstream_core::route::{JwtHeader, JwtRule, LimitScope, RateLimit, ServiceRoutes};
use std::time::Duration;

fn err(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError { field: field.into(), message: message.into() }
}

/// A duration on the wire.
fn duration(d: Duration) -> prost_types::Duration {
    // `as_secs` beyond i64 is 292 billion years; saturate rather than fail.
    prost_types::Duration { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

/// A port (0-65535) from the wire's `u32`.
fn port16(v: u32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(v).map_err(|_| err(field, format!("{v} is not a port (0-65535)")))
}

/// An optional duration from the wire: not negative, nanoseconds under a second.
fn duration_from(d: Option<&prost_types::Duration>, field: &str) -> Result<Option<Duration>, ConvertError> {
    let Some(d) = d else { return Ok(None) };
    let secs = u64::try_from(d.seconds).map_err(|_| err(field, format!("{}s is negative", d.seconds)))?;
    let nanos = u32::try_from(d.nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| err(format!("{field}.nanos"), format!("{} is not 0-999999999", d.nanos)))?;
    Ok(Some(Duration::new(secs, nanos)))
}

/// A header name: required, lower-case.
fn lower_name(name: &str, field: &str) -> Result<String, ConvertError> {
    if name.is_empty() {
        return Err(err(field, "required"));
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(err(field, format!("{name:?} is not lower-case")));
    }
    Ok(name.to_string())
}

/// A fraction in millionths: at most a million.
fn per_million(v: u32, field: &str) -> Result<u32, ConvertError> {
    if v > slipstream_core::route::traffic::MILLION {
        return Err(err(field, format!("{v} is more than a million")));
    }
    Ok(v)
}

impl From<&ServiceRoutes> for pb::ServiceRoutes {
    fn from(s: &ServiceRoutes) -> Self {
        pb::ServiceRoutes {
            service: s.service.clone(),
            rules: s.rules.iter().map(pb::RouteRule::from).collect(),
            policies: s.policies.iter().map(l7::policy).collect(),
            traffic: (s.traffic != TrafficPolicy::default()).then(|| traffic::traffic_policy(&s.traffic)),
            source: s.source.clone(),
            limits: s
                .limits
                .iter()
                .map(|l| {
                    let (routes, rules) = match &l.scope {
                        LimitScope::Service => (vec![], vec![]),
                        LimitScope::Rules { routes, rules } => (routes.clone(), rules.clone()),
                    };
                    pb::RateLimit {
                        policy: l.policy.clone(),
                        requests: l.requests,
                        interval: Some(duration(l.interval)),
                        burst: l.burst,
                        routes,
                        rules,
                    }
                })
                .collect(),
            jwt_rules: s
                .jwt_rules
                .iter()
                .map(|j| pb::JwtRule {
                    policy: j.policy.clone(),
                    issuer: j.issuer.clone(),
                    audiences: j.audiences.clone(),
                    jwks: j.jwks.clone(),
                    from_headers: j.from_headers.iter().map(|h| pb::JwtHeader { name: h.name.clone(), prefix: h.prefix.clone() }).collect(),
                    from_params: j.from_params.clone(),
                    from_cookies: j.from_cookies.clone(),
                    output_payload_to_header: j.output_payload_to_header.clone().unwrap_or_default(),
                    forward_original_token: j.forward_original_token,
                    output_claim_to_headers: j
                        .output_claim_to_headers
                        .iter()
                        .map(|(header, claim)| pb::ClaimToHeader { header: header.clone(), claim: claim.clone() })
                        .collect(),
                    space_delimited_claims: j.space_delimited_claims.clone(),
                })
                .collect(),
        }
    }
}

impl TryFrom<pb::ServiceRoutes> for ServiceRoutes {
    type Error = ConvertError;
    fn try_from(s: pb::ServiceRoutes) -> Result<Self, ConvertError> {
        if s.service.is_empty() {
            return Err(err("service", "required"));
        }
        let rules = s.rules.iter().enumerate().map(|(i, r)| rules::rule_from(r, &format!("rules[{i}]"))).collect::<Result<_, _>>()?;
        let policies =
            s.policies.iter().enumerate().map(|(i, p)| l7::policy_from(p, &format!("policies[{i}]"))).collect::<Result<_, _>>()?;
        let traffic = s.traffic.as_ref().map(|t| traffic::traffic_from(t, "traffic")).transpose()?.unwrap_or_default();
        let limits = s
            .limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let f = format!("limits[{i}]");
                let interval = duration_from(l.interval.as_ref(), &format!("{f}.interval"))?
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| err(format!("{f}.interval"), "required, more than 0"))?;
                if l.requests == 0 || l.burst == 0 {
                    return Err(err(&f, "requests and burst must be at least 1"));
                }
                let scope = if l.routes.is_empty() && l.rules.is_empty() {
                    LimitScope::Service
                } else {
                    LimitScope::Rules { routes: l.routes.clone(), rules: l.rules.clone() }
                };
                Ok(RateLimit { policy: l.policy.clone(), requests: l.requests, interval, burst: l.burst, scope })
            })
            .collect::<Result<_, ConvertError>>()?;
        let jwt_rules = s
            .jwt_rules
            .iter()
            .map(|j| JwtRule {
                policy: j.policy.clone(),
                issuer: j.issuer.clone(),
                audiences: j.audiences.clone(),
                jwks: j.jwks.clone(),
                from_headers: j
                    .from_headers
                    .iter()
                    .map(|h| JwtHeader { name: h.name.to_ascii_lowercase(), prefix: h.prefix.clone() })
                    .collect(),
                from_params: j.from_params.clone(),
                from_cookies: j.from_cookies.clone(),
                output_payload_to_header: Some(j.output_payload_to_header.to_ascii_lowercase()).filter(|h| !h.is_empty()),
                forward_original_token: j.forward_original_token,
                output_claim_to_headers: j
                    .output_claim_to_headers
                    .iter()
                    .map(|c| (c.header.to_ascii_lowercase(), c.claim.clone()))
                    .collect(),
                space_delimited_claims: j.space_delimited_claims.clone(),
            })
            .collect();
        Ok(ServiceRoutes { service: s.service, rules, policies, traffic, source: s.source, limits, jwt_rules })
    }
}

/// A `ServiceRoutes` resource, named by [`ServiceRoutes::service`].
pub fn routes_any(r: &ServiceRoutes) -> prost_types::Any {
    prost_types::Any { type_url: crate::ROUTE_TYPE_URL.to_string(), value: pb::ServiceRoutes::from(r).encode_to_vec() }
}

/// Unpacks a `ServiceRoutes` resource, checking its type URL.
pub fn routes_from_any(any: &prost_types::Any) -> Result<ServiceRoutes, ConvertError> {
    if any.type_url != crate::ROUTE_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::ROUTE_TYPE_URL, any.type_url)));
    }
    let r = pb::ServiceRoutes::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not a ServiceRoutes: {e}")))?;
    r.try_into()
}
