//! An HTTPRoute rule's `filters`: header modifiers, redirects, rewrites
//! and mirrors.

use super::matches::check_path;
use super::Reader;
use super::{service_ref, BackendRef, ObjectRefSpec};
use crate::objects::ObjectError;
use serde::Deserialize;
use slipstream_core::route::{Filters, HeaderModifier, PathRewrite, Redirect, Rewrite};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FilterSpec {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) request_header_modifier: Option<HeaderFilterSpec>,
    pub(super) response_header_modifier: Option<HeaderFilterSpec>,
    pub(super) request_redirect: Option<RedirectSpec>,
    #[serde(rename = "urlRewrite")]
    pub(super) url_rewrite: Option<RewriteSpec>,
    pub(super) request_mirror: Option<MirrorSpec>,
}

#[derive(Deserialize, Default)]
pub(super) struct HeaderFilterSpec {
    #[serde(default)]
    pub(super) set: Vec<NameValue>,
    #[serde(default)]
    pub(super) add: Vec<NameValue>,
    #[serde(default)]
    pub(super) remove: Vec<String>,
}

#[derive(Deserialize)]
pub(super) struct NameValue {
    pub(super) name: String,
    pub(super) value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RedirectSpec {
    pub(super) scheme: Option<String>,
    pub(super) hostname: Option<String>,
    pub(super) path: Option<PathModifierSpec>,
    pub(super) port: Option<i64>,
    pub(super) status_code: Option<i64>,
}

#[derive(Deserialize)]
pub(super) struct RewriteSpec {
    pub(super) hostname: Option<String>,
    pub(super) path: Option<PathModifierSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PathModifierSpec {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) replace_full_path: Option<String>,
    pub(super) replace_prefix_match: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MirrorSpec {
    pub(super) backend_ref: ObjectRefSpec,
    pub(super) percent: Option<serde_json::Value>,
    pub(super) fraction: Option<serde_json::Value>,
}

pub(super) fn header_modifier(rd: &Reader, h: Option<HeaderFilterSpec>, f: &str) -> Result<HeaderModifier, ObjectError> {
    let Some(h) = h else { return Err(rd.err(f, "required by the filter's type")) };
    let pairs = |list: Vec<NameValue>, what: &str| -> Result<Vec<(String, String)>, ObjectError> {
        list.into_iter()
            .enumerate()
            .map(|(k, nv)| {
                if nv.name.is_empty() {
                    return Err(rd.err(format!("{f}.{what}[{k}].name"), "required"));
                }
                Ok((nv.name.to_ascii_lowercase(), nv.value))
            })
            .collect()
    };
    let remove = h
        .remove
        .into_iter()
        .enumerate()
        .map(|(k, n)| if n.is_empty() { Err(rd.err(format!("{f}.remove[{k}]"), "empty")) } else { Ok(n.to_ascii_lowercase()) })
        .collect::<Result<_, _>>()?;
    Ok(HeaderModifier { set: pairs(h.set, "set")?, add: pairs(h.add, "add")?, remove })
}

pub(super) fn path_modifier(rd: &Reader, p: Option<PathModifierSpec>, f: &str) -> Result<Option<PathRewrite>, ObjectError> {
    let Some(p) = p else { return Ok(None) };
    let (value, field, rewrite): (Option<String>, &str, fn(String) -> PathRewrite) = match p.kind.as_str() {
        "ReplaceFullPath" => (p.replace_full_path, "replaceFullPath", PathRewrite::ReplaceFullPath),
        "ReplacePrefixMatch" => (p.replace_prefix_match, "replacePrefixMatch", PathRewrite::ReplacePrefixMatch),
        other => return Err(rd.err(format!("{f}.type"), format!("{other:?} is not one of ReplaceFullPath, ReplacePrefixMatch"))),
    };
    let Some(value) = value else { return Err(rd.err(format!("{f}.{field}"), format!("required by type {}", p.kind))) };
    // An empty replacement prefix is allowed (it strips the prefix).
    if !(value.is_empty() && field == "replacePrefixMatch") {
        check_path(rd, &value, &format!("{f}.{field}"))?;
    }
    Ok(Some(rewrite(value)))
}

pub(super) fn filters(rd: &Reader, list: Vec<FilterSpec>, rule: &str) -> Result<(Filters, Vec<BackendRef>), ObjectError> {
    let mut out = Filters::default();
    let mut mirrors = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (k, fl) in list.into_iter().enumerate() {
        let f = format!("{rule}.filters[{k}]");
        if fl.kind != "RequestMirror" && seen.contains(&fl.kind) {
            return Err(rd.err(format!("{f}.type"), format!("a rule takes one {} filter", fl.kind)));
        }
        seen.push(fl.kind.clone());
        match fl.kind.as_str() {
            "RequestHeaderModifier" => {
                out.request_headers = header_modifier(rd, fl.request_header_modifier, &format!("{f}.requestHeaderModifier"))?
            }
            "ResponseHeaderModifier" => {
                out.response_headers = header_modifier(rd, fl.response_header_modifier, &format!("{f}.responseHeaderModifier"))?
            }
            "RequestRedirect" => {
                let rf = format!("{f}.requestRedirect");
                let Some(r) = fl.request_redirect else { return Err(rd.err(rf, "required by the filter's type")) };
                let scheme = match r.scheme.as_deref() {
                    None | Some("http") | Some("https") => r.scheme,
                    Some(other) => return Err(rd.err(format!("{rf}.scheme"), format!("{other:?} is not http or https"))),
                };
                let status = match r.status_code {
                    None => 302,
                    Some(s @ (301 | 302)) => s as u16,
                    Some(other) => return Err(rd.err(format!("{rf}.statusCode"), format!("{other} is not supported; use 301 or 302"))),
                };
                out.redirect = Some(Redirect {
                    scheme,
                    hostname: r.hostname,
                    path: path_modifier(rd, r.path, &format!("{rf}.path"))?,
                    port: r.port.map(|p| rd.port(p, &format!("{rf}.port"))).transpose()?,
                    status,
                });
            }
            "URLRewrite" => {
                let rf = format!("{f}.urlRewrite");
                let Some(r) = fl.url_rewrite else { return Err(rd.err(rf, "required by the filter's type")) };
                out.rewrite = Some(Rewrite { hostname: r.hostname, path: path_modifier(rd, r.path, &format!("{rf}.path"))? });
            }
            "RequestMirror" => {
                let mf = format!("{f}.requestMirror");
                let Some(m) = fl.request_mirror else { return Err(rd.err(mf, "required by the filter's type")) };
                for (set, name) in [(m.percent.is_some(), "percent"), (m.fraction.is_some(), "fraction")] {
                    if set {
                        return Err(
                            rd.err(format!("{mf}.{name}"), "mirroring a part of the requests is not supported; every request is mirrored")
                        );
                    }
                }
                mirrors.push(service_ref(rd, m.backend_ref, 1, &format!("{mf}.backendRef"))?);
            }
            "ExtensionRef" => return Err(rd.err(format!("{f}.type"), "ExtensionRef filters are not supported")),
            "CORS" => return Err(rd.err(format!("{f}.type"), "CORS filters (experimental) are not supported")),
            other => return Err(rd.err(format!("{f}.type"), format!("{other:?} is not a filter type we support"))),
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(rd.err(format!("{rule}.filters"), "a rule takes RequestRedirect or URLRewrite, not both"));
    }
    Ok((out, mirrors))
}
