//! An HTTPRoute rule's `matches`: path, headers, query parameters and
//! method.

use super::Reader;
use crate::objects::ObjectError;
use serde::Deserialize;
use slipstream_core::route::{HeaderMatch, PathMatch, QueryMatch, RouteMatch};

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct MatchSpec {
    pub(super) path: Option<PathSpec>,
    #[serde(default)]
    pub(super) headers: Vec<NameMatchSpec>,
    #[serde(default)]
    pub(super) query_params: Vec<NameMatchSpec>,
    pub(super) method: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct PathSpec {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) value: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct NameMatchSpec {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) name: String,
    pub(super) value: String,
}

/// A path of a match or a redirect/rewrite: absolute, and without what
/// Gateway API's validation forbids (`//`, `/./`, `/../`, `%2f`, `#`, a
/// final `/.` or `/..`).
pub(super) fn check_path(rd: &Reader, value: &str, field: &str) -> Result<(), ObjectError> {
    if !value.starts_with('/') {
        return Err(rd.err(field, format!("{value:?} must be an absolute path (start with /)")));
    }
    for bad in ["//", "/./", "/../", "%2f", "%2F", "#"] {
        if value.contains(bad) {
            return Err(rd.err(field, format!("{value:?} must not contain {bad:?}")));
        }
    }
    if value.ends_with("/.") || value.ends_with("/..") {
        return Err(rd.err(field, format!("{value:?} must not end with /. or /..")));
    }
    Ok(())
}

/// A match type other than Exact (the default): RegularExpression is
/// refused by name, anything else as unknown.
pub(super) fn exact_only(rd: &Reader, kind: Option<&str>, field: &str) -> Result<(), ObjectError> {
    match kind {
        None | Some("Exact") => Ok(()),
        Some("RegularExpression") => Err(rd.err(field, "RegularExpression is not supported; use Exact")),
        Some(other) => Err(rd.err(field, format!("{other:?} is not a match type; use Exact"))),
    }
}

pub(super) const METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

pub(super) fn route_match(rd: &Reader, m: MatchSpec, f: &str) -> Result<RouteMatch, ObjectError> {
    let path = match m.path {
        None => PathMatch::default(),
        Some(p) => {
            let value = p.value.unwrap_or_else(|| "/".into());
            let kind = p.kind.as_deref().unwrap_or("PathPrefix");
            match kind {
                "Exact" | "PathPrefix" => check_path(rd, &value, &format!("{f}.path.value"))?,
                "RegularExpression" => {
                    return Err(rd.err(format!("{f}.path.type"), "RegularExpression is not supported; use Exact or PathPrefix"))
                }
                other => {
                    return Err(rd.err(format!("{f}.path.type"), format!("{other:?} is not a path match type; use Exact or PathPrefix")))
                }
            }
            if kind == "Exact" {
                PathMatch::Exact(value)
            } else {
                PathMatch::Prefix(value)
            }
        }
    };
    // Gateway API: of entries with equivalent names only the first counts
    // (header names are case-insensitive, query parameter names are not).
    let mut headers: Vec<HeaderMatch> = Vec::new();
    for (k, h) in m.headers.into_iter().enumerate() {
        exact_only(rd, h.kind.as_deref(), &format!("{f}.headers[{k}].type"))?;
        if h.name.is_empty() {
            return Err(rd.err(format!("{f}.headers[{k}].name"), "required"));
        }
        let name = h.name.to_ascii_lowercase();
        if !headers.iter().any(|x| x.name == name) {
            headers.push(HeaderMatch { name, value: h.value });
        }
    }
    let mut query: Vec<QueryMatch> = Vec::new();
    for (k, q) in m.query_params.into_iter().enumerate() {
        exact_only(rd, q.kind.as_deref(), &format!("{f}.queryParams[{k}].type"))?;
        if q.name.is_empty() {
            return Err(rd.err(format!("{f}.queryParams[{k}].name"), "required"));
        }
        if !query.iter().any(|x| x.name == q.name) {
            query.push(QueryMatch { name: q.name, value: q.value });
        }
    }
    if let Some(method) = &m.method {
        if !METHODS.contains(&method.as_str()) {
            return Err(rd.err(format!("{f}.method"), format!("{method:?} is not one of {}", METHODS.join(", "))));
        }
    }
    Ok(RouteMatch { path, headers, query, method: m.method, ..Default::default() })
}
