//! `slipstream.io/v1alpha1` `LocalRateLimitPolicy`: a token bucket at the
//! waypoint for a Service, an HTTPRoute (or one rule of it) or a
//! VirtualService (or one of its `http` routes), answering 429 with
//! `retry-after` when it is empty (docs/waypoint.md, "Rate limits").
//! [`rate_limit`] reads one object (every error naming its field); the
//! index attaches it to the services it reaches. Pure, for table tests.
//!
//! ```yaml
//! apiVersion: slipstream.io/v1alpha1
//! kind: LocalRateLimitPolicy
//! metadata: {name: reviews, namespace: bookinfo}
//! spec:
//!   targetRefs:
//!   - {kind: Service, name: reviews}
//!   - {group: networking.istio.io, kind: VirtualService, name: reviews, sectionName: jason}
//!   limit: {requests: 100, interval: 1s, burst: 200}
//! ```

use crate::objects::{Kind, ObjectError, ObjectRef, OpaqueObject};
use serde::Deserialize;
use std::time::Duration;

/// One policy as the index keeps it: its targets in its own namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitInput {
    pub namespace: String,
    pub name: String,
    pub targets: Vec<Target>,
    pub requests: u32,
    pub interval: Duration,
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Service(String),
    /// An HTTPRoute, and the rule (its index) if `sectionName` names one.
    HttpRoute(String, Option<String>),
    /// A VirtualService, and the `http` route (its name, or index) if
    /// `sectionName` names one.
    VirtualService(String, Option<String>),
}

impl RateLimitInput {
    /// The rule-name prefixes (whole routes) and names (one rule) its
    /// route targets reach, in the index's rule naming
    /// (`namespace/route.<rule>`).
    pub fn rule_scope(&self) -> (Vec<String>, Vec<String>) {
        let (mut routes, mut rules) = (Vec::new(), Vec::new());
        for t in &self.targets {
            match t {
                Target::Service(_) => {}
                Target::HttpRoute(r, s) | Target::VirtualService(r, s) => match s {
                    None => routes.push(format!("{}/{r}.", self.namespace)),
                    Some(s) => rules.push(format!("{}/{r}.{s}", self.namespace)),
                },
            }
        }
        (routes, rules)
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    target_refs: Vec<TargetRefSpec>,
    limit: Option<LimitSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TargetRefSpec {
    group: Option<String>,
    kind: String,
    name: String,
    section_name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct LimitSpec {
    requests: i64,
    interval: String,
    burst: Option<i64>,
}

/// Reads a LocalRateLimitPolicy. Every error names the field.
pub fn rate_limit(o: &OpaqueObject) -> Result<RateLimitInput, ObjectError> {
    let r = ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or(""));
    let err = |field: &str, m: String| ObjectError::new(&r, field, m);
    if o.kind != Kind::LocalRateLimitPolicy {
        return Err(err("kind", format!("expected LocalRateLimitPolicy, got {}", o.kind)));
    }
    let spec: Spec = match o.rest.get("spec") {
        None | Some(serde_json::Value::Null) => Spec::default(),
        Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
            err(&field, e.into_inner().to_string())
        })?,
    };
    if spec.target_refs.is_empty() {
        return Err(err("spec.targetRefs", "required: the Service, HTTPRoute or VirtualService to limit".into()));
    }
    let mut targets = Vec::new();
    for (i, t) in spec.target_refs.into_iter().enumerate() {
        let f = format!("spec.targetRefs[{i}]");
        if t.namespace.as_deref().is_some_and(|n| n != r.namespace) {
            return Err(err(&format!("{f}.namespace"), "a policy targets objects of its own namespace only".into()));
        }
        if t.name.is_empty() {
            return Err(err(&format!("{f}.name"), "required".into()));
        }
        let group = t.group.unwrap_or_default();
        targets.push(match (group.as_str(), t.kind.as_str()) {
            ("", "Service") => {
                if t.section_name.is_some() {
                    return Err(err(&format!("{f}.sectionName"), "a Service is limited as a whole".into()));
                }
                Target::Service(t.name)
            }
            ("gateway.networking.k8s.io", "HTTPRoute") => Target::HttpRoute(t.name, t.section_name),
            ("networking.istio.io", "VirtualService") => Target::VirtualService(t.name, t.section_name),
            _ => {
                return Err(err(
                    &format!("{f}.kind"),
                    format!(
                        "{} (group {group:?}) is not a target: use Service (group \"\"), HTTPRoute (gateway.networking.k8s.io) or VirtualService (networking.istio.io)",
                        t.kind
                    ),
                ))
            }
        });
    }
    let Some(l) = spec.limit else { return Err(err("spec.limit", "required: {requests, interval, burst}".into())) };
    let requests = u32::try_from(l.requests)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| err("spec.limit.requests", format!("{} is not a count of at least 1", l.requests)))?;
    let interval = crate::translate::virtual_service::duration(|m| err("spec.limit.interval", m), &l.interval)?
        .ok_or_else(|| err("spec.limit.interval", "must be more than 0".into()))?;
    if interval < Duration::from_millis(1) {
        return Err(err("spec.limit.interval", format!("{:?} is less than 1ms", l.interval)));
    }
    let burst = match l.burst {
        None => requests,
        Some(b) => {
            u32::try_from(b).ok().filter(|n| *n > 0).ok_or_else(|| err("spec.limit.burst", format!("{b} is not a count of at least 1")))?
        }
    };
    Ok(RateLimitInput { namespace: r.namespace.clone(), name: r.name.clone(), targets, requests, interval, burst })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{parse_value, ClusterObject};

    fn read(spec: &str) -> Result<RateLimitInput, ObjectError> {
        let doc = format!(
            "apiVersion: slipstream.io/v1alpha1\nkind: LocalRateLimitPolicy\nmetadata: {{name: l, namespace: bookinfo}}\nspec: {spec}\n"
        );
        let value: serde_json::Value = serde_yaml::from_str(&doc).unwrap();
        match parse_value(value) {
            Ok(Some(ClusterObject::Opaque(o))) => rate_limit(&o),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn targets_and_the_bucket() {
        let p = read("{targetRefs: [{kind: Service, name: reviews}, {group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}, {group: networking.istio.io, kind: VirtualService, name: v, sectionName: jason}], limit: {requests: 100, interval: 1m}}").unwrap();
        assert_eq!(p.targets[0], Target::Service("reviews".into()));
        assert_eq!((p.requests, p.interval, p.burst), (100, Duration::from_secs(60), 100), "burst defaults to requests");
        assert_eq!(p.rule_scope(), (vec!["bookinfo/r.".to_string()], vec!["bookinfo/v.jason".to_string()]));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            ("{limit: {requests: 1, interval: 1s}}", "spec.targetRefs", "required"),
            ("{targetRefs: [{kind: Service, name: a}]}", "spec.limit", "required"),
            ("{targetRefs: [{kind: Deployment, name: a}], limit: {requests: 1, interval: 1s}}", "spec.targetRefs[0].kind", "not a target"),
            (
                "{targetRefs: [{kind: Service, name: a, namespace: other}], limit: {requests: 1, interval: 1s}}",
                "spec.targetRefs[0].namespace",
                "own namespace",
            ),
            (
                "{targetRefs: [{kind: Service, name: a, sectionName: x}], limit: {requests: 1, interval: 1s}}",
                "spec.targetRefs[0].sectionName",
                "as a whole",
            ),
            ("{targetRefs: [{kind: Service, name: a}], limit: {requests: 0, interval: 1s}}", "spec.limit.requests", "at least 1"),
            ("{targetRefs: [{kind: Service, name: a}], limit: {requests: 1, interval: soon}}", "spec.limit.interval", "not a duration"),
            ("{targetRefs: [{kind: Service, name: a}], limit: {requests: 1, interval: 0s}}", "spec.limit.interval", "more than 0"),
            ("{targetRefs: [{kind: Service, name: a}], limit: {requests: 1, interval: 1s, burst: -1}}", "spec.limit.burst", "at least 1"),
            ("{targetRefs: [{kind: Service, name: a}], limit: {requests: x, interval: 1s}}", "spec.limit.requests", "invalid type"),
        ];
        for (spec, field, message) in cases {
            let e = read(spec).expect_err(spec);
            assert_eq!(e.field, field, "{spec}: {e}");
            assert!(e.message.contains(message), "{spec}: {e}");
        }
    }
}
