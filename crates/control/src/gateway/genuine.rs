//! Whether a pod is one of a waypoint's, decided from what a tenant cannot
//! forge into a working waypoint: what the pod runs.
//!
//! A pod's labels, `ownerReferences` and `serviceAccountName` are all
//! written by whoever creates it, and anyone who may create pods in a
//! waypoint's namespace may copy them from a real waypoint pod. What such a
//! pod may not do, and still be admitted here, is run anything else than
//! the waypoint: its spec must be the controller's rendered template
//! ([`super::render::pod_template`]) in everything that decides what runs
//! in it and what it can read (containers, images, commands, arguments,
//! environment, mounts, volumes, security contexts, probes and hooks, the
//! service account, host namespaces, DNS). A pod whose spec differs gets
//! no certificate, no configuration stream and is no replica of the
//! waypoint's Service. A pod that copies the template exactly runs the
//! waypoint itself, with its credential in a file only it reads; what can
//! still reach that credential is `pods/exec` (or `pods/attach`,
//! `pods/ephemeralcontainers`) in the waypoint's namespace, which is as
//! good as the waypoint's key (docs/security.md).
//!
//! The comparison is on a normal form: fields the API server, the
//! scheduler or admission controllers fill in and that change nothing the
//! pod runs (the node, tolerations, priority, image pull policy, resource
//! requests, the API server's defaults) are taken out of both sides, and
//! everything else must be equal. A field this code does not know, such
//! as one a newer Kubernetes adds, makes the two differ: the answer is
//! then "not the waypoint", never the other way round.

use serde_json::{Map, Value};

/// Pod-level fields that say where and when a pod runs, not what it runs
/// or can read: set by the scheduler, admission plugins or an operator
/// scaling the Deployment, and ignored.
const POD_IGNORED: &[&str] = &[
    "nodeName",
    "schedulerName",
    "tolerations",
    "priority",
    "priorityClassName",
    "preemptionPolicy",
    "enableServiceLinks",
    // The deprecated mirror of `serviceAccountName`, which is compared.
    "serviceAccount",
    "nodeSelector",
    "affinity",
    "topologySpreadConstraints",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "overhead",
    "imagePullSecrets",
    "readinessGates",
    "schedulingGates",
];

/// Container fields that change nothing the container runs or reads.
const CONTAINER_IGNORED: &[&str] = &["terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "resources"];

/// Pod-level fields whose API-server default is the same as their absence.
const POD_DEFAULTS: &[(&str, &str)] = &[("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst")];

/// Probe fields and their API-server defaults.
const PROBE_DEFAULTS: &[(&str, i64)] = &[("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1), ("failureThreshold", 3)];

/// A pod spec's normal form (see the module's comment).
pub fn normalize(spec: &Value) -> Value {
    let Some(obj) = spec.as_object() else { return spec.clone() };
    let mut out = Map::new();
    for (k, v) in obj {
        if POD_IGNORED.contains(&k.as_str()) || is_empty(v) {
            continue;
        }
        if POD_DEFAULTS.iter().any(|(dk, dv)| dk == k && v.as_str() == Some(dv)) {
            continue;
        }
        if matches!(k.as_str(), "hostNetwork" | "hostPID" | "hostIPC" | "hostUsers" | "shareProcessNamespace") && v == &Value::Bool(false) {
            continue;
        }
        let v = match k.as_str() {
            "containers" | "initContainers" | "ephemeralContainers" => map_items(v, container),
            "volumes" => map_items(v, volume),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// Null, `[]` and `{}`: what one serializer writes and another leaves out.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn map_items(v: &Value, f: fn(&Value) -> Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(f).collect()),
        other => other.clone(),
    }
}

fn container(c: &Value) -> Value {
    let Some(obj) = c.as_object() else { return c.clone() };
    let mut out = Map::new();
    for (k, v) in obj {
        if CONTAINER_IGNORED.contains(&k.as_str()) || is_empty(v) {
            continue;
        }
        let v = match k.as_str() {
            "env" => map_items(v, env),
            "ports" => map_items(v, |p| without(p, &[("protocol", Value::from("TCP"))])),
            "readinessProbe" | "livenessProbe" | "startupProbe" => probe(v),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

fn env(e: &Value) -> Value {
    let mut e = e.clone();
    if let Some(f) = e.pointer_mut("/valueFrom/fieldRef").and_then(Value::as_object_mut) {
        if f.get("apiVersion").and_then(Value::as_str) == Some("v1") {
            f.remove("apiVersion");
        }
    }
    e
}

fn probe(p: &Value) -> Value {
    let defaults: Vec<(&str, Value)> = PROBE_DEFAULTS.iter().map(|(k, v)| (*k, Value::from(*v))).collect();
    let mut p = without(p, &defaults);
    if let Some(get) = p.get_mut("httpGet") {
        *get = without(get, &[("scheme", Value::from("HTTP"))]);
    }
    p
}

fn volume(v: &Value) -> Value {
    let mut v = v.clone();
    for source in ["projected", "configMap", "secret", "downwardAPI"] {
        if let Some(s) = v.get_mut(source) {
            *s = without(s, &[("defaultMode", Value::from(420))]);
        }
    }
    if let Some(sources) = v.pointer_mut("/projected/sources").and_then(Value::as_array_mut) {
        for s in sources {
            if let Some(t) = s.get_mut("serviceAccountToken") {
                *t = without(t, &[("expirationSeconds", Value::from(3600))]);
            }
        }
    }
    v
}

/// `o` without the given keys where they hold exactly the given values.
fn without(o: &Value, defaults: &[(&str, Value)]) -> Value {
    let Some(obj) = o.as_object() else { return o.clone() };
    let mut out = obj.clone();
    for (k, dv) in defaults {
        if out.get(*k) == Some(dv) {
            out.remove(*k);
        }
    }
    Value::Object(out)
}

/// The mesh root a waypoint pod was given (its first container's
/// `SLIPSTREAM_WAYPOINT_ROOT_PEM`), as text.
pub fn root_pem(spec: &Value) -> Option<&str> {
    let env = spec.pointer("/containers/0/env")?.as_array()?;
    env.iter().find(|e| e["name"] == "SLIPSTREAM_WAYPOINT_ROOT_PEM").and_then(|e| e["value"].as_str())
}

/// Whether the pod spec `pod` runs exactly the template spec `template`;
/// if not, the first field (a path under `spec`) where they differ.
pub fn differs(pod: &Value, template: &Value) -> Option<String> {
    first_difference(&normalize(pod), &normalize(template), "spec")
}

fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{at}.{k}")),
                _ => Some(format!("{at}.{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(at.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::render::{pod_template, DeploySettings};
    use serde_json::json;

    fn settings() -> DeploySettings {
        DeploySettings {
            image: "registry.example/slipstream:1.0".into(),
            control_plane: "istiod.istio-system.svc:15012".into(),
            control_plane_san: "istiod.istio-system.svc".into(),
            root_pem: "-----BEGIN CERTIFICATE-----\n...\n".into(),
            trust_domain: "cluster.local".into(),
            cluster_id: "Kubernetes".into(),
            audience: "istio-ca".into(),
        }
    }

    /// The template as the API server stores a pod made from it: its
    /// defaults filled in, the scheduler's and admission's fields added.
    fn as_admitted(template: &Value) -> Value {
        let mut p = template["spec"].clone();
        p["nodeName"] = json!("worker-1");
        p["schedulerName"] = json!("default-scheduler");
        p["serviceAccount"] = p["serviceAccountName"].clone();
        p["restartPolicy"] = json!("Always");
        p["dnsPolicy"] = json!("ClusterFirst");
        p["enableServiceLinks"] = json!(true);
        p["priority"] = json!(0);
        p["preemptionPolicy"] = json!("PreemptLowerPriority");
        p["tolerations"] =
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
        p["initContainers"] = json!([]);
        let c = &mut p["containers"][0];
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["terminationMessagePolicy"] = json!("File");
        c["imagePullPolicy"] = json!("IfNotPresent");
        for e in c["env"].as_array_mut().unwrap() {
            if let Some(f) = e.pointer_mut("/valueFrom/fieldRef") {
                f["apiVersion"] = json!("v1");
            }
        }
        let probe = &mut c["readinessProbe"];
        probe["timeoutSeconds"] = json!(1);
        probe["successThreshold"] = json!(1);
        probe["httpGet"]["scheme"] = json!("HTTP");
        p["volumes"][0]["projected"]["defaultMode"] = json!(420);
        p
    }

    #[test]
    fn a_pod_made_from_the_template_is_the_waypoint_and_every_forgery_is_not() {
        let t = pod_template("waypoint", &settings());
        let genuine = as_admitted(&t);
        assert_eq!(differs(&genuine, &t["spec"]), None, "the ReplicaSet's pod, as the API server stores it");
        type Forge = fn(&mut Value);
        let rows: &[(&str, Forge, &str)] = &[
            (
                "another command",
                |p| p["containers"][0]["command"] = json!(["sh", "-c", "cat /var/run/secrets/tokens/istio-token"]),
                "spec.containers[0].command",
            ),
            ("arguments added", |p| p["containers"][0]["args"] = json!(["--control-plane", "evil:15012"]), "spec.containers[0].args"),
            ("another image", |p| p["containers"][0]["image"] = json!("evil/slipstream:1.0"), "spec.containers[0].image"),
            (
                "the control plane's address changed",
                |p| p["containers"][0]["env"][5]["value"] = json!("evil.example:15012"),
                "spec.containers[0].env[5].value",
            ),
            (
                "a second container",
                |p| p["containers"].as_array_mut().unwrap().push(json!({"name": "thief", "image": "busybox"})),
                "spec.containers",
            ),
            ("an init container", |p| p["initContainers"] = json!([{"name": "thief", "image": "busybox"}]), "spec.initContainers"),
            (
                "a postStart hook",
                |p| {
                    p["containers"][0]["lifecycle"] =
                        json!({"postStart": {"exec": {"command": ["sh", "-c", "cp /var/run/secrets/tokens/istio-token /tmp"]}}})
                },
                "spec.containers[0].lifecycle",
            ),
            (
                "an exec probe",
                |p| p["containers"][0]["readinessProbe"] = json!({"exec": {"command": ["cat", "/x"]}}),
                "spec.containers[0].readinessProbe.exec",
            ),
            (
                "the token volume shared",
                |p| p["volumes"][1] = json!({"name": "tmp", "hostPath": {"path": "/tmp"}}),
                "spec.volumes[1].emptyDir",
            ),
            ("root", |p| p["containers"][0]["securityContext"]["runAsUser"] = json!(0), "spec.containers[0].securityContext.runAsUser"),
            ("host network", |p| p["hostNetwork"] = json!(true), "spec.hostNetwork"),
            ("its own DNS", |p| p["dnsConfig"] = json!({"nameservers": ["10.0.0.9"]}), "spec.dnsConfig"),
            (
                "host aliases",
                |p| p["hostAliases"] = json!([{"ip": "10.0.0.9", "hostnames": ["istiod.istio-system.svc"]}]),
                "spec.hostAliases",
            ),
            ("another account", |p| p["serviceAccountName"] = json!("other"), "spec.serviceAccountName"),
            ("a shared process namespace", |p| p["shareProcessNamespace"] = json!(true), "spec.shareProcessNamespace"),
            ("a field this code does not know", |p| p["futureField"] = json!({"x": 1}), "spec.futureField"),
        ];
        for (what, forge, field) in rows {
            let mut p = genuine.clone();
            forge(&mut p);
            assert_eq!(differs(&p, &t["spec"]).as_deref(), Some(*field), "{what}");
        }
    }
}
