//! `security.istio.io` RequestAuthentication, as a waypoint enforces it
//! (docs/authorization.md, "RequestAuthentication"): the JWT rules of a
//! policy that targets a Service or a waypoint Gateway of its namespace.
//! [`request_authentication`] reads one object, every field checked and
//! every error naming its field; the index attaches the rules to the
//! routes of the services (and waypoints) they reach, with the JWKS of a
//! `jwksUri` as the control plane fetched it (`crate::jwks`) from the
//! Service of this cluster it names (never from outside the cluster).
//! Pure, for table tests.
//!
//! A policy with a `selector`, or with neither a selector nor targets,
//! is for sidecars and gateways: Istio's waypoints ignore it, and so do
//! ours. It is accepted (a user's YAML applies as it is) and reported as
//! having no effect ([`RequestAuthnInput::inert`]).

use crate::objects::{Kind, ObjectError, ObjectRef, OpaqueObject, PolicyTargetReference, WorkloadSelector};
use serde::Deserialize;
use slipstream_core::route::{JwtHeader, JwtRule};
use std::time::Duration;

/// Istio's bounds (the CRD's `maxItems`).
const MAX_TARGETS: usize = 16;
const MAX_RULES: usize = 4096;
const MAX_SPACE_DELIMITED: usize = 64;
/// Istio's default for fetching a JWKS.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longer than this, a fetch holds a control plane task for nothing.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The CRD's bound on `jwksUri`.
const MAX_URI: usize = 2048;

/// One RequestAuthentication as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAuthnInput {
    pub namespace: String,
    pub name: String,
    pub targets: Vec<Target>,
    pub rules: Vec<RuleInput>,
    /// Why it applies to no waypoint (a selector, or no targets), for the
    /// log and `slipstream apply`; None when it has targets.
    pub inert: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Service(String),
    Gateway(String),
}

/// One `jwtRules` entry: the rule the waypoint gets (`jwks` filled in by
/// the index for a fetched one) and where its keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInput {
    pub rule: JwtRule,
    pub keys: KeySource,
}

/// Where a rule's JWKS comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeySource {
    /// `jwks`, in the policy.
    Inline,
    /// `jwksUri`, naming a Service of this cluster: fetched by the control
    /// plane from that Service's cluster address.
    Uri(Fetch),
}

impl KeySource {
    /// What the control plane fetches, if anything.
    pub fn fetch(&self) -> Option<Fetch> {
        match self {
            KeySource::Inline => None,
            KeySource::Uri(f) => Some(f.clone()),
        }
    }
}

/// A JWKS the control plane fetches from a Service of the cluster: the
/// key its result is kept under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fetch {
    pub url: String,
    /// The Service the URL's host names (namespace, name), and the port
    /// (the URL's, else 80 or 443): the control plane connects to the
    /// Service's cluster address, never to what a DNS lookup answers.
    pub namespace: String,
    pub service: String,
    pub port: u16,
    pub tls: bool,
    pub timeout: Duration,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Spec {
    #[serde(default)]
    selector: Option<WorkloadSelector>,
    #[serde(default)]
    target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    target_refs: Vec<PolicyTargetReference>,
    #[serde(default)]
    jwt_rules: Vec<RuleSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleSpec {
    #[serde(default)]
    issuer: String,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default)]
    jwks_uri: Option<String>,
    /// Istio's CRD keeps the proto's own name too.
    #[serde(default, rename = "jwks_uri")]
    jwks_uri_snake: Option<String>,
    #[serde(default)]
    jwks: Option<String>,
    #[serde(default)]
    from_headers: Vec<HeaderSpec>,
    #[serde(default)]
    from_params: Vec<String>,
    #[serde(default)]
    from_cookies: Vec<String>,
    #[serde(default)]
    output_payload_to_header: Option<String>,
    #[serde(default)]
    forward_original_token: bool,
    #[serde(default)]
    output_claim_to_headers: Vec<ClaimToHeaderSpec>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    space_delimited_claims: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderSpec {
    #[serde(default)]
    name: String,
    #[serde(default)]
    prefix: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimToHeaderSpec {
    #[serde(default)]
    header: String,
    #[serde(default)]
    claim: String,
}

/// Headers a rule may not write (`outputPayloadToHeader`,
/// `outputClaimToHeaders`): the waypoint removes a rule's output headers
/// from every request and sets them from a valid token, so one of these
/// would let a policy author (or a token's holder) rewrite how the request
/// is framed, routed or attributed (`x-forwarded-for` is what `remote.ip`
/// reads).
fn reserved_header(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "forwarded",
        "via",
        "cookie",
        "traceparent",
        "tracestate",
    ];
    const PREFIXES: &[&str] = &["x-forwarded-", "proxy-", "x-envoy-", "x-slipstream-", "x-istio-", "x-b3-", "x-request-id"];
    let n = name.to_ascii_lowercase();
    EXACT.contains(&n.as_str()) || PREFIXES.iter().any(|p| n.starts_with(p))
}

/// Reads a RequestAuthentication. Every error names the field.
pub fn request_authentication(o: &OpaqueObject, domain_suffix: &str) -> Result<RequestAuthnInput, ObjectError> {
    let r = ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or(""));
    let err = |field: &str, m: String| ObjectError::new(&r, field, m);
    if o.kind != Kind::RequestAuthentication {
        return Err(err("kind", format!("expected RequestAuthentication, got {}", o.kind)));
    }
    let spec: Spec = match o.rest.get("spec") {
        None | Some(serde_json::Value::Null) => Spec::default(),
        Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
            err(&field, e.into_inner().to_string())
        })?,
    };
    let targeted = spec.target_ref.is_some() || !spec.target_refs.is_empty();
    if targeted && spec.selector.is_some() {
        return Err(err("spec.selector", "cannot be set together with spec.targetRef or spec.targetRefs".into()));
    }
    if spec.target_ref.is_some() && !spec.target_refs.is_empty() {
        return Err(err("spec.targetRef", "cannot be set together with spec.targetRefs".into()));
    }
    if spec.target_refs.len() > MAX_TARGETS {
        return Err(err("spec.targetRefs", format!("{} targets; at most {MAX_TARGETS}", spec.target_refs.len())));
    }
    if spec.jwt_rules.len() > MAX_RULES {
        return Err(err("spec.jwtRules", format!("{} rules; at most {MAX_RULES}", spec.jwt_rules.len())));
    }
    let refs: Vec<(String, PolicyTargetReference)> = match spec.target_ref {
        Some(t) => vec![("spec.targetRef".to_string(), t)],
        None => spec.target_refs.into_iter().enumerate().map(|(i, t)| (format!("spec.targetRefs[{i}]"), t)).collect(),
    };
    let mut targets = Vec::new();
    for (field, t) in refs {
        if !t.namespace.is_empty() && t.namespace != r.namespace {
            return Err(err(&format!("{field}.namespace"), "must be the policy's own namespace".into()));
        }
        if t.name.is_empty() {
            return Err(err(&format!("{field}.name"), "required".into()));
        }
        targets.push(match (t.group.as_str(), t.kind.as_str()) {
            ("" | "core", "Service") => Target::Service(t.name),
            ("gateway.networking.k8s.io", "Gateway") => Target::Gateway(t.name),
            ("gateway.networking.k8s.io", "GatewayClass") => {
                return Err(err(&format!("{field}.kind"), "GatewayClass targets are not supported; target the Gateway".into()))
            }
            (g, k) => {
                return Err(err(
                    &format!("{field}.kind"),
                    format!("{k:?} (group {g:?}) is not a target a waypoint enforces: use a Service, or a Gateway of class istio-waypoint"),
                ))
            }
        });
    }
    let policy = format!("{}/{}", r.namespace, r.name);
    let mut rules = Vec::new();
    for (i, rs) in spec.jwt_rules.into_iter().enumerate() {
        rules.push(rule(rs, &format!("spec.jwtRules[{i}]"), &policy, domain_suffix, &err)?);
    }
    let inert = if !targets.is_empty() {
        None
    } else if spec.selector.is_some() {
        Some("spec.selector: a selector-bound RequestAuthentication is for sidecars; waypoints (Istio's and ours) apply only those with spec.targetRefs naming a Service or a waypoint Gateway".to_string())
    } else {
        Some("no spec.targetRefs: a namespace-wide RequestAuthentication is for sidecars; waypoints (Istio's and ours) apply only those with spec.targetRefs naming a Service or a waypoint Gateway".to_string())
    };
    Ok(RequestAuthnInput { namespace: r.namespace.clone(), name: r.name.clone(), targets, rules, inert })
}

fn rule(
    rs: RuleSpec,
    f: &str,
    policy: &str,
    domain_suffix: &str,
    err: &impl Fn(&str, String) -> ObjectError,
) -> Result<RuleInput, ObjectError> {
    let field = |name: &str| format!("{f}.{name}");
    let nonempty = |list: &[String], name: &str| -> Result<(), ObjectError> {
        match list.iter().position(|s| s.is_empty()) {
            Some(j) => Err(err(&format!("{}[{j}]", field(name)), "must not be empty".into())),
            None => Ok(()),
        }
    };
    nonempty(&rs.audiences, "audiences")?;
    nonempty(&rs.from_params, "fromParams")?;
    nonempty(&rs.from_cookies, "fromCookies")?;
    nonempty(&rs.space_delimited_claims, "spaceDelimitedClaims")?;
    if rs.space_delimited_claims.len() > MAX_SPACE_DELIMITED {
        return Err(err(
            &field("spaceDelimitedClaims"),
            format!("{} claims; at most {MAX_SPACE_DELIMITED}", rs.space_delimited_claims.len()),
        ));
    }
    let uri = match (rs.jwks_uri, rs.jwks_uri_snake) {
        (Some(_), Some(_)) => return Err(err(&field("jwks_uri"), "cannot be set together with jwksUri".into())),
        (a, b) => a.or(b),
    };
    let (uri_field, uri) = (field("jwksUri"), uri);
    if uri.is_some() && rs.jwks.is_some() {
        return Err(err(&field("jwks"), "cannot be set together with jwksUri".into()));
    }
    if rs.issuer.is_empty() && uri.is_none() {
        return Err(err(&field("issuer"), "required when there is no jwksUri".into()));
    }
    if uri.is_none() && rs.jwks.is_none() {
        return Err(err(
            &field("jwksUri"),
            "required, or jwks: the keys come from the policy or from a Service of this cluster (Istio's discovery from the issuer's \
             OpenID configuration would fetch from outside the cluster, which the control plane does not do)"
                .into(),
        ));
    }
    let timeout = match rs.timeout.as_deref() {
        None => DEFAULT_TIMEOUT,
        Some(t) => {
            let d = crate::translate::virtual_service::duration(|m| err(&field("timeout"), m), t)?
                .filter(|d| *d >= Duration::from_millis(1))
                .ok_or_else(|| err(&field("timeout"), format!("{t:?}: must be at least 1ms")))?;
            if d > MAX_TIMEOUT {
                return Err(err(&field("timeout"), format!("{t:?}: at most {}s", MAX_TIMEOUT.as_secs())));
            }
            d
        }
    };
    let (keys, jwks) = match (uri, rs.jwks) {
        (_, Some(jwks)) => {
            check_jwks(&jwks).map_err(|m| err(&field("jwks"), m))?;
            (KeySource::Inline, jwks)
        }
        (Some(uri), None) => {
            let f = in_cluster(&uri, timeout, domain_suffix).map_err(|m| err(&uri_field, m))?;
            (KeySource::Uri(f), String::new())
        }
        (None, None) => unreachable!("refused above"),
    };
    let from_headers = from_headers(rs.from_headers, f, err)?;
    let (output_payload_to_header, output_claim_to_headers) =
        output_headers(rs.output_payload_to_header.as_deref(), rs.output_claim_to_headers, f, err)?;
    Ok(RuleInput {
        rule: JwtRule {
            policy: policy.to_string(),
            issuer: rs.issuer,
            audiences: rs.audiences,
            jwks,
            from_headers,
            from_params: rs.from_params,
            from_cookies: rs.from_cookies,
            output_payload_to_header,
            forward_original_token: rs.forward_original_token,
            output_claim_to_headers,
            space_delimited_claims: rs.space_delimited_claims,
        },
        keys,
    })
}

/// A rule's `fromHeaders`: names checked and lowercased.
fn from_headers(list: Vec<HeaderSpec>, f: &str, err: &impl Fn(&str, String) -> ObjectError) -> Result<Vec<JwtHeader>, ObjectError> {
    let mut from_headers = Vec::new();
    for (j, h) in list.into_iter().enumerate() {
        let hf = format!("{f}.fromHeaders[{j}].name");
        if h.name.is_empty() {
            return Err(err(&hf, "required".into()));
        }
        http::HeaderName::try_from(h.name.as_str()).map_err(|_| err(&hf, format!("{:?} is not a header name", h.name)))?;
        from_headers.push(JwtHeader { name: h.name.to_ascii_lowercase(), prefix: h.prefix });
    }
    Ok(from_headers)
}

/// `outputPayloadToHeader`, and `outputClaimToHeaders` as (header, claim).
type OutputHeaders = (Option<String>, Vec<(String, String)>);

/// A rule's `outputPayloadToHeader` and `outputClaimToHeaders`: names
/// checked and lowercased, none reserved, none written twice.
fn output_headers(
    payload: Option<&str>,
    claims: Vec<ClaimToHeaderSpec>,
    f: &str,
    err: &impl Fn(&str, String) -> ObjectError,
) -> Result<OutputHeaders, ObjectError> {
    let output_header = |name: &str, hf: &str| -> Result<String, ObjectError> {
        if name.is_empty() {
            return Err(err(hf, "required".into()));
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(err(hf, format!("{name:?} is not a header name (letters, digits, '-' and '_')")));
        }
        if reserved_header(name) {
            return Err(err(hf, format!("{name:?} is a header the mesh or HTTP itself gives meaning to; choose another")));
        }
        Ok(name.to_ascii_lowercase())
    };
    let output_payload_to_header = payload.map(|h| output_header(h, &format!("{f}.outputPayloadToHeader"))).transpose()?;
    let mut output_claim_to_headers: Vec<(String, String)> = Vec::new();
    for (j, c) in claims.into_iter().enumerate() {
        let header = output_header(&c.header, &format!("{f}.outputClaimToHeaders[{j}].header"))?;
        if c.claim.is_empty() {
            return Err(err(&format!("{f}.outputClaimToHeaders[{j}].claim"), "required".into()));
        }
        if output_claim_to_headers.iter().any(|(h, _)| *h == header) || output_payload_to_header.as_deref() == Some(header.as_str()) {
            return Err(err(&format!("{f}.outputClaimToHeaders[{j}].header"), format!("{header:?} is written twice")));
        }
        output_claim_to_headers.push((header, c.claim));
    }
    Ok((output_payload_to_header, output_claim_to_headers))
}

/// An `http` or `https` URL whose host is a Service of this cluster
/// (`<name>.<namespace>.svc`, or with the cluster's domain after it): what
/// the control plane fetches, from inside the cluster only.
fn in_cluster(uri: &str, timeout: Duration, domain_suffix: &str) -> Result<Fetch, String> {
    if uri.len() > MAX_URI {
        return Err(format!("{} characters; at most {MAX_URI}", uri.len()));
    }
    let u: http::Uri = uri.parse().map_err(|e| format!("{uri:?} is not a URL: {e}"))?;
    let tls = match u.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("{uri:?}: the URL must have scheme http:// or https://")),
    };
    let host = u.host().unwrap_or("").trim_end_matches('.').to_ascii_lowercase();
    let cluster = format!("svc.{domain_suffix}");
    let parts: Vec<&str> = host.splitn(3, '.').collect();
    let (service, namespace) = match parts.as_slice() {
        [s, n, rest] if *rest == "svc" || *rest == cluster => (s.to_string(), n.to_string()),
        _ => {
            return Err(format!(
                "{uri:?}: the host must be a Service of this cluster (<name>.<namespace>.svc or <name>.<namespace>.{cluster}): \
                 the control plane fetches keys from inside the cluster only; for an issuer outside it, put its keys in jwks"
            ))
        }
    };
    if service.is_empty() || namespace.is_empty() {
        return Err(format!("{uri:?}: the host names no Service"));
    }
    let port = u.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok(Fetch { url: uri.to_string(), namespace, service, port, tls, timeout })
}

/// A JSON Web Key Set: an object with a `keys` array of keys that each
/// name their type (`kty`). The waypoint reads the keys; this catches the
/// set that could never validate a token.
pub fn check_jwks(text: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let keys = v.get("keys").and_then(|k| k.as_array()).ok_or("a JWKS is an object with a `keys` array")?;
    if keys.is_empty() {
        return Err("the JWKS has no key".into());
    }
    for (i, k) in keys.iter().enumerate() {
        match k.get("kty").and_then(|t| t.as_str()) {
            Some("RSA" | "EC" | "OKP") => {}
            Some(t) => return Err(format!("keys[{i}].kty: {t:?} is not a key type for signatures (RSA, EC or OKP)")),
            None => return Err(format!("keys[{i}].kty: required")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
