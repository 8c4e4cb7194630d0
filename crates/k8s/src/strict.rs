//! Field validation, as kubectl's `--validate`: a field Kubernetes does not
//! know (a typo such as `spec.replcas`) is refused, or reported, or dropped;
//! a field Kubernetes knows but the local cluster does not act on
//! (`imagePullPolicy`, `resources`, `strategy`) is accepted with an
//! "ignored" warning, so users can bring their real manifests.
//!
//! What Kubernetes knows comes from `k8s-openapi`'s types of the API (one
//! version, see the workspace manifest): each document is deserialized into
//! them through `serde_ignored`, which reports every key the type skipped.
//! What we act on is found the same way with our own types.

use serde::de::DeserializeOwned;
use std::fmt;
use std::str::FromStr;

/// What to do with fields Kubernetes does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Refuse the manifest (kubectl's default, `--validate=strict`).
    #[default]
    Strict,
    /// Apply it and print a warning per unknown field.
    Warn,
    /// Apply it and say nothing.
    Ignore,
}

impl FromStr for FieldValidation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" | "true" => Ok(FieldValidation::Strict),
            "warn" => Ok(FieldValidation::Warn),
            "ignore" | "false" => Ok(FieldValidation::Ignore),
            _ => Err(format!("{s:?}: use strict, warn or ignore")),
        }
    }
}

impl fmt::Display for FieldValidation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldValidation::Strict => "strict",
            FieldValidation::Warn => "warn",
            FieldValidation::Ignore => "ignore",
        })
    }
}

/// The outcome for one document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldReport {
    /// Paths Kubernetes does not know (`spec.replcas`).
    pub unknown: Vec<String>,
    /// Paths Kubernetes knows and the local cluster does not act on.
    pub ignored: Vec<String>,
}

/// Paths of the keys of `value` that `T` does not have, in the notation of
/// our errors (`spec.containers[0].imagePullPolicy`).
pub fn skipped_by<T: DeserializeOwned>(value: &serde_json::Value) -> Vec<String> {
    let mut paths = Vec::new();
    // A type error is reported by our own types; here only the keys count.
    let _ = serde_ignored::deserialize::<_, _, T>(value, |p| paths.push(path_string(&p)));
    paths
}

fn path_string(p: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", path_string(parent)),
        Path::Map { parent, key } => {
            let pp = path_string(parent);
            if pp.is_empty() {
                key.clone()
            } else {
                format!("{pp}.{key}")
            }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => path_string(parent),
    }
}

/// Set by the API server, so harmless in a manifest (they appear in the
/// output of `kubectl get -o yaml` and `kubectl create --dry-run`).
fn server_set(path: &str) -> bool {
    const META: &[&str] = &["creationTimestamp", "resourceVersion", "uid", "generation", "managedFields", "selfLink"];
    path == "status"
        || path == "apiVersion"
        || path == "kind"
        || path.rsplit_once('.').is_some_and(|(parent, last)| parent.ends_with("metadata") && META.contains(&last))
}

/// The API server accepts a number where a quantity is due (`cpu: 1`);
/// k8s-openapi's `Quantity` is a string, and a type error would end its
/// scan of the document early.
fn quantities_as_strings(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("limits" | "requests", Value::Object(q)) => Value::Object(
                            q.iter()
                                .map(|(r, n)| (r.clone(), if n.is_number() { Value::String(n.to_string()) } else { n.clone() }))
                                .collect(),
                        ),
                        _ => quantities_as_strings(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(quantities_as_strings).collect()),
        other => other.clone(),
    }
}

/// Checks one document of a kind we parse (`kind` is its `kind`).
pub fn check(kind: &str, value: &serde_json::Value) -> FieldReport {
    use crate::objects as ours;
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let normalized = quantities_as_strings(value);
    let k8s = &normalized;
    let (unknown, ours_skipped) = match kind {
        "Namespace" => (skipped_by::<core::Namespace>(k8s), skipped_by::<ours::Namespace>(value)),
        "ServiceAccount" => (skipped_by::<core::ServiceAccount>(k8s), skipped_by::<ours::ServiceAccount>(value)),
        "Pod" => (skipped_by::<core::Pod>(k8s), skipped_by::<ours::Pod>(value)),
        "Deployment" => (skipped_by::<apps::Deployment>(k8s), skipped_by::<ours::Deployment>(value)),
        "Service" => (skipped_by::<core::Service>(k8s), skipped_by::<ours::Service>(value)),
        // Other kinds are stored as they are: only their metadata is ours.
        _ => {
            let Some(meta) = value.get("metadata") else { return FieldReport::default() };
            let prefix = |v: Vec<String>| v.into_iter().map(|p| format!("metadata.{p}")).collect::<Vec<_>>();
            (prefix(skipped_by::<ObjectMeta>(meta)), prefix(skipped_by::<ours::ObjectMeta>(meta)))
        }
    };
    let ignored = ours_skipped.into_iter().filter(|p| !unknown.contains(p) && !server_set(p)).collect();
    FieldReport { unknown, ignored }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(yaml: &str) -> FieldReport {
        let v: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
        check(v["kind"].as_str().unwrap(), &v)
    }

    #[test]
    fn unknown_fields_have_paths_at_every_depth() {
        let r = report(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, labls: {a: b}, creationTimestamp: null}\nspec:\n  replcas: 2\n  strategy: {type: Recreate}\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        command: [x]\n        imagePullPolicy: Always\n        resources: {limits: {cpu: 1}}\n        securityContext: {capabilties: {add: [NET_ADMIN]}}\n        ports: [{containerPort: 80, protcol: TCP}]\nstatus: {replicas: 2}\n",
        );
        assert_eq!(
            r.unknown,
            vec![
                "metadata.labls",
                "spec.replcas",
                "spec.template.spec.containers[0].ports[0].protcol",
                "spec.template.spec.containers[0].securityContext.capabilties",
            ]
        );
        assert_eq!(
            r.ignored,
            vec!["spec.strategy", "spec.template.spec.containers[0].imagePullPolicy", "spec.template.spec.containers[0].resources"]
        );
    }

    #[test]
    fn other_kinds_and_clean_documents() {
        assert_eq!(
            report("apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}], sessionAffinity: None}\n").ignored,
            vec!["spec.sessionAffinity"]
        );
        let r = report("apiVersion: v1\nkind: Namespace\nmetadata: {name: n, nmae: x}\n");
        assert_eq!(r.unknown, vec!["metadata.nmae"]);
        let r = report("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, anotations: {}}\ndata: {a: b}\n");
        assert_eq!(r.unknown, vec!["metadata.anotations"]);
        let r = report("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, command: [x]}]}\n");
        assert_eq!(r, FieldReport::default());
    }

    #[test]
    fn modes_parse() {
        assert_eq!("warn".parse::<FieldValidation>(), Ok(FieldValidation::Warn));
        assert_eq!("false".parse::<FieldValidation>(), Ok(FieldValidation::Ignore));
        assert_eq!("strict".parse::<FieldValidation>(), Ok(FieldValidation::Strict));
        assert!("loose".parse::<FieldValidation>().is_err());
    }
}
