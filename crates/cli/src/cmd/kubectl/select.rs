//! What a verb was asked for (kinds and names, a label selector, a
//! namespace or all) and the agent's objects that answer it.

use super::kinds::{kind, Kind};
use crate::common::Ctx;
use anyhow::bail;
use serde_json::Value;
use slipstream_testbed::ipc::{Request, Response};
use std::collections::BTreeMap;
use std::time::Duration;

/// What `get`, `describe`, `wait` and `delete` were asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub kind: Kind,
    /// Empty: every object of the kind.
    pub names: Vec<String>,
}

/// kubectl's argument forms: `KIND[,KIND...] [NAME...]` or `KIND/NAME ...`;
/// `all` is pods, services and deployments.
pub fn wanted(args: &[String]) -> Result<Vec<Wanted>, String> {
    let Some(first) = args.first() else { return Err("you must specify the type of resource to get".into()) };
    if first.contains('/') {
        let mut out: Vec<Wanted> = Vec::new();
        for a in args {
            let (k, n) = a.split_once('/').ok_or_else(|| format!("there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {a:?})"))?;
            if n.is_empty() {
                return Err(format!("{a:?}: no name after the type"));
            }
            let k = kind(k)?;
            match out.iter_mut().find(|w| w.kind == k) {
                Some(w) => w.names.push(n.to_string()),
                None => out.push(Wanted { kind: k, names: vec![n.to_string()] }),
            }
        }
        return Ok(out);
    }
    let names: Vec<String> = args[1..].to_vec();
    if names.iter().any(|n| n.contains('/')) {
        return Err(
            "there is no need to specify a resource type as a separate argument when passing arguments in resource/name form".into()
        );
    }
    let mut out = Vec::new();
    for k in first.split(',') {
        if k == "all" {
            for k in ["Pod", "Service", "Deployment"] {
                out.push(Wanted { kind: kind(k)?, names: names.clone() });
            }
        } else {
            out.push(Wanted { kind: kind(k)?, names: names.clone() });
        }
    }
    Ok(out)
}

/// A label selector of kubectl's equality forms: `k=v`, `k==v`, `k!=v`,
/// `k` (exists), `!k` (absent), comma-separated (all must hold).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<(String, Req)>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String),
    Ne(String),
    Exists,
    Absent,
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let r = if let Some((k, v)) = part.split_once("!=") {
                (k.trim().to_string(), Req::Ne(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k.trim().to_string(), Req::Eq(v.trim().to_string()))
            } else if let Some(k) = part.strip_prefix('!') {
                (k.trim().to_string(), Req::Absent)
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!(
                    "unable to parse requirement {part:?}: set-based selectors (in, notin) are not supported; use k=v, k!=v, k or !k"
                ));
            } else {
                (part.to_string(), Req::Exists)
            };
            slipstream_k8s::names::check_label_key(&r.0).map_err(|e| format!("selector {part:?}: {e}"))?;
            out.push(r);
        }
        Ok(Selector(out))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(k, r)| match r {
            Req::Eq(v) => labels.get(k) == Some(v),
            Req::Ne(v) => labels.get(k) != Some(v),
            Req::Exists => labels.contains_key(k),
            Req::Absent => !labels.contains_key(k),
        })
    }
}

/// An object's labels.
pub(super) fn labels_of(o: &Value) -> BTreeMap<String, String> {
    o["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default()
}

/// An object's name.
pub(super) fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

/// An object's namespace (empty for a cluster-wide kind).
pub(super) fn namespace_of(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or("")
}

/// Where to look: one namespace, or all (`-A`).
#[derive(Debug, Clone)]
pub struct Scope {
    pub namespace: Option<String>,
    pub all: bool,
    pub selector: Selector,
}

impl Scope {
    pub(super) fn admits(&self, k: &Kind, o: &Value) -> bool {
        (!k.namespaced || self.all || Some(namespace_of(o)) == self.namespace.as_deref().or(Some("default")))
            && self.selector.matches(&labels_of(o))
    }

    /// The namespace looked in (`default` unless given).
    pub(super) fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// The agent's objects, as the API server would serve them.
pub(crate) fn objects(ctx: &Ctx) -> anyhow::Result<Vec<Value>> {
    match ctx.call(&Request::Objects, Duration::from_secs(10))? {
        Response::Objects { items } => Ok(items),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// The objects of `w` in `scope`, or kubectl's NotFound error for a name
/// that does not exist.
pub fn select<'a>(all: &'a [Value], w: &Wanted, scope: &Scope) -> Result<Vec<&'a Value>, String> {
    let of_kind: Vec<&Value> = all.iter().filter(|o| o["kind"] == w.kind.kind && scope.admits(&w.kind, o)).collect();
    if w.names.is_empty() {
        return Ok(of_kind);
    }
    w.names
        .iter()
        .map(|n| {
            of_kind.iter().find(|o| name_of(o) == n).copied().ok_or_else(|| {
                format!("Error from server (NotFound): {} \"{n}\" not found", w.kind.plural.split('.').next().unwrap_or(w.kind.plural))
            })
        })
        .collect()
}

/// The `status.conditions` entry of that type (kubectl compares types
/// without case), as a boolean; None when there is none.
pub(super) fn status_condition(o: &Value, type_: &str) -> Option<bool> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"].as_str().is_some_and(|t| t.eq_ignore_ascii_case(type_)))
        .map(|c| c["status"] == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn argument_forms() {
        let w = wanted(&s(&["pods"])).unwrap();
        assert_eq!((w.len(), w[0].kind.kind, w[0].names.len()), (1, "Pod", 0));
        let w = wanted(&s(&["pod", "a", "b"])).unwrap();
        assert_eq!(w[0].names, s(&["a", "b"]));
        let w = wanted(&s(&["pods,svc"])).unwrap();
        assert_eq!(w.iter().map(|w| w.kind.kind).collect::<Vec<_>>(), ["Pod", "Service"]);
        let w = wanted(&s(&["pod/a", "svc/b", "pod/c"])).unwrap();
        assert_eq!((w.len(), w[0].names.clone()), (2, s(&["a", "c"])));
        let w = wanted(&s(&["all"])).unwrap();
        assert_eq!(w.len(), 3);
        assert!(wanted(&s(&["pod", "x/y"])).is_err());
        assert!(wanted(&[]).is_err());
    }

    #[test]
    fn selectors() {
        let l: BTreeMap<String, String> = [("app".into(), "web".into()), ("v".into(), "1".into())].into();
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app", true),
            ("!app", false),
            ("!tier", true),
            ("app=web,v=1", true),
            ("app=web,v=2", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(Selector::parse("env in (a,b)").is_err());
    }
}
