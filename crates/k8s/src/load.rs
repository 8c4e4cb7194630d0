//! YAML (or JSON) text to typed objects.

use crate::error::{ManifestError, ManifestErrors};
use crate::objects::*;
use crate::strict::{self, FieldValidation};
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
    /// 1-based YAML document index inside `source`.
    pub document: usize,
    pub warnings: Vec<String>,
}

impl Loaded {
    /// `file` or `file (document N)`.
    pub fn place(&self) -> String {
        if self.document > 1 {
            format!("{} (document {})", self.source, self.document)
        } else {
            self.source.clone()
        }
    }
}

/// The path that means standard input, as in `kubectl apply -f -`.
pub const STDIN: &str = "-";

/// `load_paths_with` in strict field validation.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Loaded>, ManifestErrors> {
    load_paths_with(paths, FieldValidation::Strict)
}

/// Loads every file given: a file, `-` for standard input, or a directory
/// whose `*.yaml`, `*.yml` and `*.json` files are read in name order (not
/// recursively, like `kubectl apply -f DIR`). All errors of all files are
/// returned together; the same object defined twice is one of them.
pub fn load_paths_with(paths: &[PathBuf], mode: FieldValidation) -> Result<Vec<Loaded>, ManifestErrors> {
    load_paths_in(paths, mode, None)
}

/// As [`load_paths_with`], with kubectl's `-n NAMESPACE`: the namespace of
/// every namespaced object that names none; one that names another is an
/// error, as kubectl says.
pub fn load_paths_in(paths: &[PathBuf], mode: FieldValidation, namespace: Option<&str>) -> Result<Vec<Loaded>, ManifestErrors> {
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
        let stdin = f.as_os_str() == STDIN;
        let label = if stdin { "<stdin>".to_string() } else { f.display().to_string() };
        let text = if stdin { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(&f) };
        match text {
            Ok(text) => match load_str_in(&text, &Source(label), mode, namespace) {
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
    errors.extend(duplicates(&out));
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ManifestErrors(errors))
    }
}

/// One error per object defined more than once, naming both places (the
/// API server would apply the last one silently; `delete` would then fail).
pub fn duplicates(loaded: &[Loaded]) -> Vec<ManifestError> {
    let mut first: std::collections::BTreeMap<ObjectKey, &Loaded> = Default::default();
    let mut errors = Vec::new();
    for l in loaded {
        match first.get(&l.object.key()) {
            Some(f) => errors.push(ManifestError {
                source: l.source.clone(),
                document: l.document,
                object: Some(describe(&l.object)),
                field: String::new(),
                message: format!("defined twice: also in {}; each object may appear once per apply", f.place()),
            }),
            None => {
                first.insert(l.object.key(), l);
            }
        }
    }
    errors
}

fn collect_files(p: &Path) -> Result<Vec<PathBuf>, String> {
    if p.as_os_str() == STDIN {
        return Ok(vec![p.to_path_buf()]);
    }
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
    // An empty directory is like an empty file: nothing to apply, which the
    // command reports ("no objects passed to apply").
    Ok(v)
}

/// Parses every document of `text`. Empty documents are skipped; `kind:
/// List` is flattened. Objects are validated one by one (cross-object checks,
/// such as a namespace existing, happen where the whole cluster is known).
pub fn load_str(text: &str, source: &Source) -> Result<Vec<Loaded>, ManifestErrors> {
    load_str_with(text, source, FieldValidation::Strict)
}

/// `load_str` with the given treatment of fields Kubernetes does not know.
pub fn load_str_with(text: &str, source: &Source, mode: FieldValidation) -> Result<Vec<Loaded>, ManifestErrors> {
    load_str_in(text, source, mode, None)
}

/// Kinds without a namespace (kubectl's `-n` does not apply to them).
const CLUSTER_SCOPED: &[&str] = &["Namespace", "ClusterRole", "ClusterRoleBinding", "GatewayClass", "CustomResourceDefinition"];

/// `load_str_with` under kubectl's `-n`: objects without a namespace get
/// `namespace`, objects naming another one are refused.
pub fn load_str_in(text: &str, source: &Source, mode: FieldValidation, namespace: Option<&str>) -> Result<Vec<Loaded>, ManifestErrors> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = At { source, document: i + 1 };
        match read_document(doc) {
            Document::Empty => {}
            Document::Broken(message) => {
                errors.push(at.err(None, "", message));
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
            Document::Refused { field, message } => errors.push(at.err(None, field, message)),
            Document::Items(items) => {
                for value in items {
                    load_item(&at, value, mode, namespace, &mut out, &mut errors);
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ManifestErrors(errors))
    }
}

/// Where an error is: the file and the document in it.
struct At<'a> {
    source: &'a Source,
    document: usize,
}

impl At<'_> {
    fn err(&self, object: Option<String>, field: &str, message: String) -> ManifestError {
        ManifestError { source: self.source.0.clone(), document: self.document, object, field: field.to_string(), message }
    }
}

/// What one YAML document holds.
enum Document {
    /// Nothing (`---` alone, comments).
    Empty,
    /// Its objects (a `kind: List` flattened).
    Items(Vec<serde_json::Value>),
    /// A document that is not a manifest; the next ones are read.
    Refused { field: &'static str, message: String },
    /// Not YAML: the stream stops here.
    Broken(String),
}

fn read_document(doc: serde_yaml::Deserializer) -> Document {
    let value = match serde_yaml::Value::deserialize(doc) {
        Ok(v) => v,
        Err(e) => return Document::Broken(format!("not valid YAML: {e}")),
    };
    if value.is_null() {
        return Document::Empty;
    }
    let value: serde_json::Value = match serde_json::to_value(&value) {
        Ok(v) => v,
        Err(e) => return Document::Refused { field: "", message: format!("cannot be represented as JSON: {e}") },
    };
    if value.get("kind").and_then(|k| k.as_str()) == Some("List") {
        match value.get("items").and_then(|i| i.as_array()) {
            Some(items) => Document::Items(items.clone()),
            None => Document::Refused { field: "items", message: "a List needs an `items` array".into() },
        }
    } else {
        Document::Items(vec![value])
    }
}

/// Puts a namespaced object without a namespace in `ns` (kubectl's `-n`);
/// refuses one that names another.
fn place_in_namespace(at: &At, value: &mut serde_json::Value, kind: &str, ns: &str) -> Result<(), ManifestError> {
    let given = value.pointer("/metadata/namespace").and_then(|n| n.as_str()).filter(|n| !n.is_empty()).map(String::from);
    match given {
        Some(g) if g != ns => {
            let name = value.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("").to_string();
            Err(at.err(
                Some(format!("{kind} {g}/{name}")),
                "metadata.namespace",
                format!("the namespace from the provided object \"{g}\" does not match the namespace \"{ns}\". You must pass '--namespace={g}' to perform this operation."),
            ))
        }
        Some(_) => Ok(()),
        None => {
            if let Some(m) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                m.insert("namespace".into(), serde_json::Value::String(ns.to_string()));
            }
            Ok(())
        }
    }
}

/// One object of a document: typed, its fields checked as `mode` says,
/// validated; into `out`, or its errors into `errors`.
fn load_item(
    at: &At,
    mut value: serde_json::Value,
    mode: FieldValidation,
    namespace: Option<&str>,
    out: &mut Vec<Loaded>,
    errors: &mut Vec<ManifestError>,
) {
    let (source, document) = (at.source, at.document);
    let err = |object: Option<String>, field: &str, message: String| at.err(object, field, message);
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("").to_string();
    if let (Some(ns), false) = (namespace, CLUSTER_SCOPED.contains(&kind.as_str())) {
        if let Err(e) = place_in_namespace(at, &mut value, &kind, ns) {
            errors.push(e);
            return;
        }
    }
    let fields = strict::check(&kind, &value);
    match object_from_value(value) {
        Ok((object, warnings)) => {
            let label = describe(&object);
            let mut unknown = Vec::new();
            let mut warnings = warnings;
            for path in fields.unknown {
                match mode {
                    FieldValidation::Strict => unknown.push(err(
                        Some(label.clone()),
                        &path,
                        "unknown field (Kubernetes has no such field; check its spelling, or apply with --validate=warn to drop it)".into(),
                    )),
                    FieldValidation::Warn => warnings.push(format!("{label}: {path}: unknown field, dropped")),
                    FieldValidation::Ignore => {}
                }
            }
            warnings.extend(fields.ignored.iter().map(|p| format!("{label}: {p}: ignored by the local cluster")));
            match validate::validate(&object) {
                Ok(w) if unknown.is_empty() => {
                    warnings.extend(w.into_iter().map(|w| format!("{label}: {w}")));
                    out.push(Loaded { object, source: source.0.clone(), document, warnings })
                }
                Ok(_) => errors.append(&mut unknown),
                Err(fes) => {
                    errors.append(&mut unknown);
                    for fe in fes {
                        errors.push(err(Some(label.clone()), &fe.field, fe.message));
                    }
                }
            }
        }
        Err((object, field, message)) => errors.push(err(object, &field, message)),
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
                let kept: KeptObject = typed(value).map_err(|e| with(&label, e))?;
                if !note.is_empty() && !crate::objects::is_mesh_config(&kept) {
                    warnings.push(format!("{label}: {note}"));
                }
                Object::Kept(kept)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict::FieldValidation::*;

    const TYPO: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\nspec:\n  replcas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - {name: c, command: [x], imagePullPolicy: Always}\n";

    #[test]
    fn unknown_fields_by_mode() {
        let e = load_str_with(TYPO, &Source("web.yaml".into()), Strict).unwrap_err().to_string();
        assert_eq!(
            e,
            "web.yaml (document 2): Deployment demo/web: spec.replcas: unknown field (Kubernetes has no such field; \
             check its spelling, or apply with --validate=warn to drop it)"
        );
        let v = load_str_with(TYPO, &Source("web.yaml".into()), Warn).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!((v[1].document, v[1].place()), (2, "web.yaml (document 2)".to_string()));
        assert_eq!(
            v[1].warnings,
            vec![
                "Deployment demo/web: spec.replcas: unknown field, dropped",
                "Deployment demo/web: spec.template.spec.containers[0].imagePullPolicy: ignored by the local cluster",
            ]
        );
        let v = load_str_with(TYPO, &Source("web.yaml".into()), Ignore).unwrap();
        assert_eq!(
            v[1].warnings,
            vec!["Deployment demo/web: spec.template.spec.containers[0].imagePullPolicy: ignored by the local cluster"]
        );
    }

    #[test]
    fn duplicates_name_both_places() {
        let dir = tempfile::tempdir().unwrap();
        let sa = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n";
        std::fs::write(dir.path().join("1.yaml"), format!("{sa}---\n{sa}")).unwrap();
        std::fs::write(dir.path().join("2.yaml"), sa).unwrap();
        let e = load_paths(&[dir.path().to_path_buf()]).unwrap_err();
        let d = dir.path().display();
        assert_eq!(e.0.len(), 2, "{e}");
        assert_eq!(
            e.0[0].to_string(),
            format!("{d}/1.yaml (document 2): ServiceAccount default/a: defined twice: also in {d}/1.yaml; each object may appear once per apply")
        );
        assert!(e.0[1].to_string().starts_with(&format!("{d}/2.yaml: ServiceAccount default/a: defined twice: also in {d}/1.yaml")), "{e}");
        // The same name in two namespaces, or two kinds, is no duplicate.
        std::fs::write(dir.path().join("2.yaml"), "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, namespace: x}\n").unwrap();
        std::fs::write(dir.path().join("1.yaml"), format!("{sa}---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: a}}\n")).unwrap();
        assert_eq!(load_paths(&[dir.path().to_path_buf()]).unwrap().len(), 3);
    }

    #[test]
    fn kubectl_dash_n_fills_the_namespace_and_refuses_another() {
        let y =
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: bookinfo}\n";
        let v = load_str_in(y, &Source("t".into()), FieldValidation::Strict, Some("bookinfo")).unwrap();
        assert_eq!(v[0].object.key().namespace, "bookinfo");
        assert_eq!(v[1].object.key().namespace, "", "a Namespace has none");
        let other = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, namespace: prod}\n";
        let e = load_str_in(other, &Source("t".into()), FieldValidation::Strict, Some("bookinfo")).unwrap_err().to_string();
        assert!(e.contains("metadata.namespace") && e.contains("--namespace=prod"), "{e}");
        let same = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, namespace: bookinfo}\n";
        assert!(load_str_in(same, &Source("t".into()), FieldValidation::Strict, Some("bookinfo")).is_ok());
    }

    #[test]
    fn empty_inputs_load_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_paths(&[dir.path().to_path_buf()]).unwrap().is_empty(), "a directory without manifests");
        std::fs::write(dir.path().join("e.yaml"), "# only a comment\n---\n").unwrap();
        assert!(load_paths(&[dir.path().join("e.yaml")]).unwrap().is_empty(), "a file of empty documents");
        let e = load_paths(&[dir.path().join("missing.yaml")]).unwrap_err().to_string();
        assert!(e.contains("missing.yaml: cannot read"), "{e}");
    }

    #[test]
    fn huge_values_are_not_echoed() {
        let big = "v".repeat(1 << 20);
        let y = format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: a, labels: {{app: {big}}}}}\n");
        let e = load_str(&y, &Source("big.yaml".into())).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..400]);
        assert!(e.contains("metadata.labels[app]: \"vvvv") && e.contains("... (1048576 bytes) is longer than 63 characters"), "{e}");
        let y = format!("apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: a}}\nspec: {{replicas: \"{big}\"}}\n");
        let e = load_str(&y, &Source("big.yaml".into())).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains("spec.replicas: invalid type"), "{e:.400}");
    }
}
