//! Gateway API GRPCRoute, read as the HTTPRoute it means on the wire: a
//! gRPC call is an HTTP/2 POST to `/<service>/<method>`, so a method
//! match is a path match (both named: that exact path; the service only:
//! every method of it, the prefix `/<service>/`), and the rest of a rule
//! (headers, filters, backendRefs) has HTTPRoute's shape. The waypoint
//! then routes it like any request, over HTTP/2 to the endpoint.
//!
//! Refused, naming the field: RegularExpression method matches, a method
//! match without a service (it would need a regular expression), and
//! filters GRPCRoute does not have (RequestRedirect, URLRewrite).
//! Precedence is HTTPRoute's, which ranks an exact method above a
//! service, and more header matches first, as GRPCRoute's does.

use super::{from_spec, parse_spec, Reader};
use crate::objects::{Kind, ObjectError, ObjectRef, OpaqueObject};
use serde_json::{json, Value};

/// Reads a GRPCRoute. Every error names the field, from `spec.` on.
pub fn grpc_route(o: &OpaqueObject) -> Result<super::HttpRouteInput, ObjectError> {
    let rd = Reader { r: ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or("")) };
    if o.kind != Kind::GRPCRoute {
        return Err(rd.err("kind", format!("expected GRPCRoute, got {}", o.kind)));
    }
    let mut spec = o.rest.get("spec").cloned().unwrap_or(Value::Null);
    if let Some(rules) = spec.get_mut("rules").and_then(Value::as_array_mut) {
        for (i, rule) in rules.iter_mut().enumerate() {
            let f = format!("spec.rules[{i}]");
            if let Some(filters) = rule.get("filters").and_then(Value::as_array) {
                for (j, fl) in filters.iter().enumerate() {
                    let kind = fl.get("type").and_then(Value::as_str).unwrap_or("");
                    if matches!(kind, "RequestRedirect" | "URLRewrite") {
                        return Err(rd.err(format!("{f}.filters[{j}].type"), format!("{kind} is not a GRPCRoute filter")));
                    }
                }
            }
            if let Some(matches) = rule.get_mut("matches").and_then(Value::as_array_mut) {
                for (j, m) in matches.iter_mut().enumerate() {
                    let g = format!("{f}.matches[{j}]");
                    let Some(obj) = m.as_object_mut() else { continue };
                    let Some(method) = obj.remove("method") else { continue };
                    obj.insert("path".into(), path_of(&rd, &method, &format!("{g}.method"))?);
                }
            }
        }
    }
    let spec = parse_spec(&rd, Some(&spec))?;
    // Rule names are `namespace/name.<index>`, as for HTTPRoute.
    from_spec(rd, o, spec)
}

/// A GRPCMethodMatch as an HTTPRoute path match.
fn path_of(rd: &Reader, m: &Value, f: &str) -> Result<Value, ObjectError> {
    let kind = m.get("type").and_then(Value::as_str).unwrap_or("Exact");
    if kind == "RegularExpression" {
        return Err(rd.err(format!("{f}.type"), "RegularExpression is not supported; use Exact"));
    }
    if kind != "Exact" {
        return Err(rd.err(format!("{f}.type"), format!("{kind:?} is not a match type; use Exact")));
    }
    let name = |k: &str| -> Result<Option<&str>, ObjectError> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if valid(s) => Ok(Some(s.as_str())),
            Some(other) => Err(rd.err(format!("{f}.{k}"), format!("{other} is not a gRPC {k} name"))),
        }
    };
    match (name("service")?, name("method")?) {
        (Some(s), Some(me)) => Ok(json!({"type": "Exact", "value": format!("/{s}/{me}")})),
        (Some(s), None) => Ok(json!({"type": "PathPrefix", "value": format!("/{s}")})),
        (None, Some(_)) => {
            Err(rd.err(format!("{f}.service"), "required with method: a method of any service would need a regular expression"))
        }
        (None, None) => Err(rd.err(f, "needs a service, or a service and a method")),
    }
}

/// A service or method name: letters, digits, `_` and (services) `.`.
fn valid(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{parse_value, ClusterObject};
    use slipstream_core::route::PathMatch;

    fn read(spec: &str) -> Result<super::super::HttpRouteInput, ObjectError> {
        let doc =
            format!("apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: g, namespace: demo}}\nspec: {spec}\n");
        let value: Value = serde_yaml::from_str(&doc).unwrap();
        match parse_value(value) {
            Ok(Some(ClusterObject::Opaque(o))) => grpc_route(&o),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn methods_become_paths() {
        let r = read("{parentRefs: [{group: '', kind: Service, name: grpc}], rules: [{matches: [{method: {service: pkg.Svc, method: Get}}, {method: {service: pkg.Other}, headers: [{name: x-v, value: '2'}]}], backendRefs: [{name: grpc-v2, port: 9090}]}, {backendRefs: [{name: grpc-v1, port: 9090}]}]}").unwrap();
        assert_eq!(r.parents[0].name, "grpc");
        assert_eq!(r.rules[0].matches[0].path, PathMatch::Exact("/pkg.Svc/Get".into()));
        assert_eq!(r.rules[0].matches[1].path, PathMatch::Prefix("/pkg.Other".into()));
        assert_eq!(r.rules[0].matches[1].headers[0].name, "x-v");
        assert_eq!(r.rules[1].matches[0].path, PathMatch::default(), "no matches: every call");
        assert!(PathMatch::Prefix("/pkg.Other".into()).matches("/pkg.Other/Any"));
        assert!(!PathMatch::Prefix("/pkg.Other".into()).matches("/pkg.OtherSvc/Any"));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                "{rules: [{matches: [{method: {type: RegularExpression, service: a}}]}]}",
                "spec.rules[0].matches[0].method.type",
                "RegularExpression",
            ),
            ("{rules: [{matches: [{method: {method: Get}}]}]}", "spec.rules[0].matches[0].method.service", "required with method"),
            ("{rules: [{matches: [{method: {}}]}]}", "spec.rules[0].matches[0].method", "needs a service"),
            ("{rules: [{matches: [{method: {service: \"a/b\"}}]}]}", "spec.rules[0].matches[0].method.service", "not a gRPC service name"),
            ("{rules: [{filters: [{type: URLRewrite, urlRewrite: {}}]}]}", "spec.rules[0].filters[0].type", "not a GRPCRoute filter"),
            ("{rules: [{backendRefs: [{name: a, weight: -1}]}]}", "spec.rules[0].backendRefs[0].weight", "not a weight"),
        ];
        for (spec, field, message) in cases {
            let e = read(spec).expect_err(spec);
            assert_eq!(e.field, field, "{spec}: {e}");
            assert!(e.message.contains(message), "{spec}: {e}");
            assert_eq!(e.kind.as_str(), "GRPCRoute");
        }
    }
}
