//! YAML (or JSON) text to typed objects.

use crate::error::{ManifestError, ManifestErrors};
use crate::objects::*;
use crate::validate;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where a manifest came from, used only in error messages.
#[derive(Debug, Clone)]
pub struct Source(pub String);

/// The kinds `load_str` understands natively, for the "unknown kind" error.
pub const NATIVE_KINDS: &[(&str, &str)] =
    &[("v1", "Namespace"), ("v1", "ServiceAccount"), ("v1", "Pod"), ("apps/v1", "Deployment"), ("v1", "Service")];

/// A loaded object plus the warnings it produced (ignored fields, kept kinds).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub object: Object,
    pub source: String,
    pub warnings: Vec<String>,
}

/// Loads every file given: a file, or a directory whose `*.yaml`, `*.yml`
/// and `*.json` files are read in name order (not recursively, like
/// `kubectl apply -f DIR`). All errors of all files are returned together.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Loaded>, ManifestErrors> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        match collect_files(p) {
            Ok(mut f) => files.append(&mut f),
            Err(message) => {
                errors.push(ManifestError { source: p.display().to_string(), document: 0, object: None, field: String::new(), message })
            }
        }
    }
    let mut out = Vec::new();
    for f in files {
        let label = f.display().to_string();
        match std::fs::read_to_string(&f) {
            Ok(text) => match load_str(&text, &Source(label)) {
                Ok(mut v) => out.append(&mut v),
                Err(mut e) => errors.append(&mut e.0),
            },
            Err(e) => errors.push(ManifestError {
                source: label,
                document: 0,
                object: None,
                field: String::new(),
                message: format!("cannot read: {e}"),
            }),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ManifestErrors(errors))
    }
}

fn collect_files(p: &Path) -> Result<Vec<PathBuf>, String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot read: {e}"))?;
    if meta.is_file() {
        return Ok(vec![p.to_path_buf()]);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(|e| format!("cannot list directory: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| f.is_file() && matches!(f.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err("directory holds no .yaml, .yml or .json file".into());
    }
    Ok(v)
}

/// Parses every document of `text`. Empty documents are skipped; `kind:
/// List` is flattened. Objects are validated one by one (cross-object checks,
/// such as a namespace existing, happen where the whole cluster is known).
pub fn load_str(text: &str, source: &Source) -> Result<Vec<Loaded>, ManifestErrors> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let err = |object: Option<String>, field: &str, message: String| ManifestError {
            source: source.0.clone(),
            document,
            object,
            field: field.to_string(),
            message,
        };
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                errors.push(err(None, "", format!("not valid YAML: {e}")));
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        let value: serde_json::Value = match serde_json::to_value(&value) {
            Ok(v) => v,
            Err(e) => {
                errors.push(err(None, "", format!("cannot be represented as JSON: {e}")));
                continue;
            }
        };
        let items = if value.get("kind").and_then(|k| k.as_str()) == Some("List") {
            match value.get("items").and_then(|i| i.as_array()) {
                Some(items) => items.clone(),
                None => {
                    errors.push(err(None, "items", "a List needs an `items` array".into()));
                    continue;
                }
            }
        } else {
            vec![value]
        };
        for value in items {
            match object_from_value(value) {
                Ok((object, warnings)) => {
                    let label = describe(&object);
                    match validate::validate(&object) {
                        Ok(mut w) => {
                            let mut warnings = warnings;
                            warnings.append(&mut w);
                            out.push(Loaded { object, source: source.0.clone(), warnings })
                        }
                        Err(fes) => {
                            for fe in fes {
                                errors.push(err(Some(label.clone()), &fe.field, fe.message));
                            }
                        }
                    }
                }
                Err((object, field, message)) => errors.push(err(object, &field, message)),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ManifestErrors(errors))
    }
}

/// `Kind namespace/name` (or `Kind name` for cluster-scoped objects).
pub fn describe(o: &Object) -> String {
    o.key().to_string()
}

type ConvertError = (Option<String>, String, String);

fn object_from_value(value: serde_json::Value) -> Result<(Object, Vec<String>), ConvertError> {
    let Some(map) = value.as_object() else {
        return Err((None, String::new(), "a manifest must be a mapping with apiVersion, kind and metadata".into()));
    };
    let kind = match map.get("kind") {
        Some(serde_json::Value::String(k)) if !k.is_empty() => k.clone(),
        Some(_) => return Err((None, "kind".into(), "must be a non-empty string".into())),
        None => return Err((None, "kind".into(), "required".into())),
    };
    let api_version = match map.get("apiVersion") {
        Some(serde_json::Value::String(a)) if !a.is_empty() => a.clone(),
        Some(_) => return Err((None, "apiVersion".into(), "must be a non-empty string".into())),
        None => return Err((None, "apiVersion".into(), "required".into())),
    };
    let name = map.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or("").to_string();
    let namespace = map
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string();
    let label = if kind == "Namespace" { format!("{kind} {name}") } else { format!("{kind} {namespace}/{name}") };

    let native = NATIVE_KINDS.iter().find(|(_, k)| *k == kind);
    let mut warnings = Vec::new();
    let mut object = match native {
        Some((want_version, _)) => {
            if api_version != *want_version {
                return Err((Some(label), "apiVersion".into(), format!("{kind} must have apiVersion {want_version} (got {api_version})")));
            }
            let convert = |v| -> Result<Object, ConvertError> {
                Ok(match kind.as_str() {
                    "Namespace" => Object::Namespace(typed(v).map_err(|e| with(&label, e))?),
                    "ServiceAccount" => Object::ServiceAccount(typed(v).map_err(|e| with(&label, e))?),
                    "Pod" => Object::Pod(typed(v).map_err(|e| with(&label, e))?),
                    "Deployment" => Object::Deployment(typed(v).map_err(|e| with(&label, e))?),
                    "Service" => Object::Service(typed(v).map_err(|e| with(&label, e))?),
                    _ => unreachable!("NATIVE_KINDS lists only the kinds matched here"),
                })
            };
            convert(value)?
        }
        None => match kept_note(&api_version, &kind) {
            Some(note) => {
                if !note.is_empty() {
                    warnings.push(format!("{label}: {note}"));
                }
                Object::Kept(typed(value).map_err(|e| with(&label, e))?)
            }
            None => {
                let mut supported: Vec<String> = NATIVE_KINDS.iter().map(|(a, k)| format!("{k} ({a})")).collect();
                supported.extend(KEPT_KINDS.iter().map(|(g, k, _)| if g.is_empty() { format!("{k} (v1)") } else { format!("{k} ({g})") }));
                return Err((
                    Some(label),
                    "kind".into(),
                    format!("kind {kind} (apiVersion {api_version}) is not supported; supported kinds: {}", supported.join(", ")),
                ));
            }
        },
    };
    // kubectl's default: a namespaced object without a namespace goes to `default`.
    if !object.is_cluster_scoped() && object.metadata().namespace.is_empty() {
        object.metadata_mut().namespace = "default".into();
    }
    Ok((object, warnings))
}

fn with(label: &str, (field, message): (String, String)) -> ConvertError {
    (Some(label.to_string()), field, message)
}

/// Deserializes with the path of the failing field, so that a type error
/// reads `spec.replicas: invalid type: string "two", expected i64`.
fn typed<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        (field, e.into_inner().to_string())
    })
}
