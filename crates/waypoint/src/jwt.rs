//! RequestAuthentication at the waypoint, with Istio's meaning: a request
//! that carries a token where a jwtRule looks for one must carry a valid
//! token (signature against the rule's JWKS, issuer, audience, time),
//! else it is refused (401; 403 when only the audience is wrong, as
//! Envoy's filter answers); a request that carries none goes on with no
//! request identity, and only an AuthorizationPolicy that asks for one
//! (`requestPrincipals`, `request.auth.*`) refuses it then.
//!
//! What a valid token establishes ([`RequestAuth`]: `<iss>/<sub>`,
//! audiences, presenter, claims) is what the policies read. The token is
//! taken out of the request the app receives unless the rule says
//! `forwardOriginalToken` (as Envoy: only from a header), and the rule's
//! `outputPayloadToHeader` and `outputClaimToHeaders` are set on it. Those
//! output headers are removed from every request first, token or not, so
//! a client cannot pass one off as what the mesh verified.

use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{errors::ErrorKind, DecodingKey, Validation};
use slipstream_core::policy::l7::RequestAuth;
use slipstream_core::route::JwtRule;
use std::sync::Arc;

/// A rule with its keys parsed once (when the routes arrive), not per
/// request.
pub struct Prepared {
    rule: JwtRule,
    /// `kid` (if the key has one), the key, its `alg` (if it names one).
    keys: Vec<(Option<String>, DecodingKey, Option<jsonwebtoken::Algorithm>)>,
    /// Why the JWKS gave no key, for the refusal's text.
    no_keys: Option<String>,
}

impl Prepared {
    pub fn new(rule: &JwtRule) -> Prepared {
        let mut keys = Vec::new();
        let mut no_keys = None;
        if rule.jwks.trim().is_empty() {
            no_keys = Some("its JWKS could not be obtained".to_string());
        } else {
            match serde_json::from_str::<JwkSet>(&rule.jwks) {
                Ok(set) => {
                    for jwk in &set.keys {
                        if let Ok(key) = DecodingKey::from_jwk(jwk) {
                            let alg = jwk.common.key_algorithm.and_then(|a| a.to_string().parse().ok());
                            keys.push((jwk.common.key_id.clone(), key, alg));
                        }
                    }
                    if keys.is_empty() {
                        no_keys = Some("its JWKS holds no key this waypoint can use".to_string());
                    }
                }
                Err(e) => no_keys = Some(format!("its JWKS does not parse: {e}")),
            }
        }
        Prepared { rule: rule.clone(), keys, no_keys }
    }
}

/// Why a request's token is refused: the status and the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("Jwt verification fails ({policy}): {why}")]
    Invalid { policy: String, why: String },
    #[error("Audiences in Jwt are not allowed ({policy})")]
    Audience { policy: String },
}

impl JwtError {
    pub fn status(&self) -> u16 {
        match self {
            JwtError::Invalid { .. } => 401,
            JwtError::Audience { .. } => 403,
        }
    }

    pub fn policy(&self) -> &str {
        match self {
            JwtError::Invalid { policy, .. } | JwtError::Audience { policy } => policy,
        }
    }
}

/// A valid token's outcome: what it established, and the changes to the
/// request the app receives.
#[derive(Debug)]
pub struct Authenticated {
    pub auth: RequestAuth,
    /// `namespace/name` of the RequestAuthentication that validated it.
    pub policy: String,
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, HeaderValue)>,
}

impl Authenticated {
    /// Takes the token out (unless forwarded) and sets the output headers.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for h in &self.remove {
            headers.remove(h);
        }
        for (k, v) in &self.set {
            headers.insert(k.clone(), v.clone());
        }
    }
}

/// Where a token was found.
enum Location {
    Header(HeaderName),
    Param,
    Cookie,
}

/// The output headers of `rules`: removed from every request before the
/// token is looked at.
pub fn strip_outputs(rules: &[Arc<Prepared>], headers: &mut HeaderMap) {
    for p in rules {
        let r = &p.rule;
        for name in r.output_payload_to_header.iter().chain(r.output_claim_to_headers.iter().map(|(h, _)| h)) {
            headers.remove(name.as_str());
        }
    }
}

/// Every token `rule` finds in the request, in every place it looks and
/// every occurrence there (a header sent twice, a parameter repeated, one
/// in the header and one in the query): each must be valid, so a client
/// cannot have one token checked and the application read another. Err
/// when a header it reads holds a value without the rule's prefix (Istio:
/// invalid).
fn find(rule: &JwtRule, headers: &HeaderMap, query: &str) -> Result<Vec<(String, Location)>, String> {
    let mut out = Vec::new();
    let defaults = rule.from_headers.is_empty() && rule.from_params.is_empty() && rule.from_cookies.is_empty();
    if defaults {
        // `Authorization: Bearer <token>` (another scheme is no token of
        // this rule's), and `access_token`.
        for v in headers.get_all(http::header::AUTHORIZATION) {
            let v = v.to_str().map_err(|_| "header authorization is not text".to_string())?;
            if let Some(t) = strip_prefix_ignore_case(v, "Bearer ").map(str::trim).filter(|t| !t.is_empty()) {
                out.push((t.to_string(), Location::Header(http::header::AUTHORIZATION)));
            }
        }
        out.extend(params(query, "access_token").map(|t| (t, Location::Param)));
        return Ok(out);
    }
    for h in &rule.from_headers {
        let Ok(name) = HeaderName::try_from(h.name.as_str()) else { continue };
        for v in headers.get_all(&name) {
            let v = v.to_str().map_err(|_| format!("header {name} is not text"))?;
            let t = strip_prefix_ignore_case(v, &h.prefix).ok_or_else(|| format!("header {name} does not start with {:?}", h.prefix))?;
            out.push((t.trim().to_string(), Location::Header(name.clone())));
        }
    }
    for p in &rule.from_params {
        out.extend(params(query, p).map(|t| (t, Location::Param)));
    }
    for c in &rule.from_cookies {
        out.extend(cookies(headers, c).map(|t| (t, Location::Cookie)));
    }
    Ok(out)
}

/// `v` without `prefix`, compared as Envoy compares a token's prefix:
/// ignoring ASCII case (an authentication scheme is case-insensitive, and
/// applications read `bearer` too).
fn strip_prefix_ignore_case<'a>(v: &'a str, prefix: &str) -> Option<&'a str> {
    let head = v.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &v[prefix.len()..])
}

/// Every non-empty value of the query parameter `name`, names and values
/// percent-decoded, pairs split at `&` and at `;` (as some frameworks
/// split them: the application must not read one we did not check).
fn params<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = String> + 'a {
    query.split(['&', ';']).filter_map(move |kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k) == name && !v.is_empty()).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = String> + 'a {
    headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).filter_map(move |kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k.trim() == name && !v.trim().is_empty()).then(|| v.trim().to_string())
    })
}

/// Checks `token` against `p`: its claims, or why not (`true`: only the
/// audience was wrong).
fn verify(p: &Prepared, token: &str) -> Result<serde_json::Map<String, serde_json::Value>, (bool, String)> {
    if let Some(why) = &p.no_keys {
        return Err((false, why.clone()));
    }
    let header = jsonwebtoken::decode_header(token).map_err(|e| (false, format!("not a JWT: {e}")))?;
    let mut validation = Validation::new(header.alg);
    validation.required_spec_claims.clear();
    validation.validate_nbf = true;
    validation.leeway = 60;
    if !p.rule.issuer.is_empty() {
        validation.set_issuer(&[&p.rule.issuer]);
        validation.required_spec_claims.insert("iss".into());
    }
    if p.rule.audiences.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(&p.rule.audiences);
        validation.required_spec_claims.insert("aud".into());
    }
    let mut last = (false, "no key of its JWKS matches the token".to_string());
    for (kid, key, alg) in &p.keys {
        if header.kid.is_some() && kid.is_some() && header.kid != *kid {
            continue;
        }
        if alg.is_some_and(|a| a != header.alg) {
            continue;
        }
        match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) => {
                let audience = matches!(e.kind(), ErrorKind::InvalidAudience);
                last = (audience, e.to_string());
                // Only a wrong signature (or a key of another kind) is
                // worth another key; anything else is the token's.
                if !matches!(e.kind(), ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat) {
                    return Err(last);
                }
            }
        }
    }
    Err(last)
}

/// What a valid token establishes, with the rule's claims split.
fn request_auth(rule: &JwtRule, mut claims: serde_json::Map<String, serde_json::Value>) -> RequestAuth {
    use serde_json::Value;
    for name in ["scope", "permission"].into_iter().chain(rule.space_delimited_claims.iter().map(String::as_str)) {
        if let Some(Value::String(s)) = claims.get(name) {
            let list: Vec<Value> = s.split_whitespace().map(|w| Value::String(w.to_string())).collect();
            claims.insert(name.to_string(), Value::Array(list));
        }
    }
    let text = |k: &str| claims.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let audiences = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => Vec::new(),
    };
    RequestAuth {
        principal: format!("{}/{}", text("iss"), text("sub")),
        audiences,
        presenter: claims.get("azp").and_then(Value::as_str).map(str::to_string),
        claims,
    }
}

/// A claim (`a.b` for nested ones) as a header value: strings, numbers and
/// booleans only.
fn claim_value(claims: &serde_json::Map<String, serde_json::Value>, path: &str) -> Option<HeaderValue> {
    let mut parts = path.split('.');
    let mut v = claims.get(parts.next()?)?;
    for p in parts {
        v = v.get(p)?;
    }
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    HeaderValue::try_from(text).ok()
}

/// The request's authentication by `rules`: None when it carries no token
/// where any rule looks; the first valid token's outcome; or why a token
/// is refused. Every token found must be valid for a rule that found it.
pub fn authenticate(rules: &[Arc<Prepared>], headers: &HeaderMap, query: &str) -> Result<Option<Authenticated>, JwtError> {
    let mut found: Vec<(String, Location, Vec<&Prepared>)> = Vec::new();
    for p in rules {
        match find(&p.rule, headers, query) {
            Err(why) => return Err(JwtError::Invalid { policy: p.rule.policy.clone(), why }),
            Ok(tokens) => {
                for (token, loc) in tokens {
                    match found.iter_mut().find(|(t, _, _)| *t == token) {
                        Some((_, _, by)) => {
                            if !by.iter().any(|b| std::ptr::eq(*b, p.as_ref())) {
                                by.push(p)
                            }
                        }
                        None => found.push((token, loc, vec![p])),
                    }
                }
            }
        }
    }
    let mut first: Option<Authenticated> = None;
    for (token, loc, by) in found {
        let mut refusal: Option<JwtError> = None;
        let mut ok = None;
        for p in &by {
            match verify(p, &token) {
                Ok(claims) => {
                    ok = Some((*p, claims));
                    break;
                }
                Err((audience, why)) => {
                    let e = if audience {
                        JwtError::Audience { policy: p.rule.policy.clone() }
                    } else {
                        JwtError::Invalid { policy: p.rule.policy.clone(), why }
                    };
                    // A signature or issuer failure says more than an
                    // audience one of another rule.
                    if refusal.as_ref().map_or(true, |r| matches!(r, JwtError::Audience { .. })) {
                        refusal = Some(e);
                    }
                }
            }
        }
        let Some((p, claims)) = ok else {
            return Err(refusal.unwrap_or(JwtError::Invalid { policy: String::new(), why: "no rule validated the token".into() }));
        };
        if first.is_some() {
            continue;
        }
        let mut remove = Vec::new();
        if let (Location::Header(h), false) = (&loc, p.rule.forward_original_token) {
            remove.push(h.clone());
        }
        let mut set = Vec::new();
        if let Some(h) = &p.rule.output_payload_to_header {
            // The token's own payload part: base64url of the claims' JSON.
            let payload = token.split('.').nth(1).unwrap_or_default();
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).unwrap_or_default();
            let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
            if let (Ok(n), Ok(v)) = (HeaderName::try_from(h.as_str()), HeaderValue::try_from(encoded)) {
                set.push((n, v));
            }
        }
        for (h, claim) in &p.rule.output_claim_to_headers {
            if let (Ok(n), Some(v)) = (HeaderName::try_from(h.as_str()), claim_value(&claims, claim)) {
                set.push((n, v));
            }
        }
        first = Some(Authenticated { auth: request_auth(&p.rule, claims), policy: p.rule.policy.clone(), remove, set });
    }
    Ok(first)
}

#[cfg(test)]
mod tests;
