//! The controllers of the local cluster, as pure functions: which pods the
//! stored objects ask for.

use crate::names::{fnv1a, replica_pod_name, safe_encode};
use crate::objects::*;

/// One pod the cluster should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInstance {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub spec: PodSpec,
    /// The Deployment that owns it, if any.
    pub owner: Option<String>,
    /// Hash of what the pod runs; a changed spec means the pod is replaced.
    pub spec_hash: String,
}

/// Hash of a pod template, in Kubernetes' `pod-template-hash` shape.
pub fn template_hash(metadata: &ObjectMeta, spec: &PodSpec) -> String {
    let text = serde_json::to_string(&(metadata, spec)).expect("objects serialize");
    safe_encode(fnv1a(text.as_bytes()), 10)
}

/// Expands Pods and Deployments into the pods they ask for, in a stable
/// order (objects in the order given, replicas by index).
pub fn desired_pods<'a>(objects: impl IntoIterator<Item = &'a Object>) -> Vec<PodInstance> {
    let mut out = Vec::new();
    for o in objects {
        match o {
            Object::Pod(p) => out.push(PodInstance {
                namespace: p.metadata.namespace.clone(),
                name: p.metadata.name.clone(),
                labels: p.metadata.labels.clone(),
                annotations: p.metadata.annotations.clone(),
                spec: p.spec.clone(),
                owner: None,
                spec_hash: template_hash(&p.metadata, &p.spec),
            }),
            Object::Deployment(d) => {
                let t = &d.spec.template;
                let hash = template_hash(&t.metadata, &t.spec);
                for i in 0..d.spec.replicas() {
                    let mut labels = t.metadata.labels.clone();
                    labels.insert("pod-template-hash".into(), hash.clone());
                    out.push(PodInstance {
                        namespace: d.metadata.namespace.clone(),
                        name: replica_pod_name(&d.metadata.name, &hash, i),
                        labels,
                        annotations: t.metadata.annotations.clone(),
                        spec: t.spec.clone(),
                        owner: Some(d.metadata.name.clone()),
                        spec_hash: hash.clone(),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether `labels` satisfy a Service selector (every pair present).
pub fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The label every object made for a waypoint Gateway carries (Istio's
/// value): users cannot apply objects with it.
pub const WAYPOINT_MANAGED_LABEL: &str = "gateway.istio.io/managed";
pub const WAYPOINT_MANAGED_VALUE: &str = "istio.io-mesh-controller";
/// Names the Gateway on the objects made for it and on its pods.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The status port of a waypoint pod (`/healthz/ready`).
pub const WAYPOINT_STATUS_PORT: i64 = 15021;

/// What Istio's gateway controller makes for a Gateway of class
/// `istio-waypoint`, named after it: a ServiceAccount (its identity), a
/// Deployment of one pod running `slipstream waypoint` outside the mesh
/// (`istio.io/dataplane-mode: none`), and a Service with its HBONE port
/// `mesh` (15008) and `status-port` (15021). None for any other Gateway.
pub fn waypoint_objects(gw: &KeptObject) -> Option<Vec<Object>> {
    if gw.kind != "Gateway" || gw.spec.get("gatewayClassName").and_then(|c| c.as_str()) != Some("istio-waypoint") {
        return None;
    }
    let name = gw.metadata.name.clone();
    let ns = gw.metadata.namespace.clone();
    let mut labels = Labels::new();
    labels.insert(WAYPOINT_MANAGED_LABEL.into(), WAYPOINT_MANAGED_VALUE.into());
    labels.insert(GATEWAY_NAME_LABEL.into(), name.clone());
    let meta = ObjectMeta { name: name.clone(), namespace: ns.clone(), labels: labels.clone(), annotations: Labels::new() };
    let mut pod_labels = labels.clone();
    pod_labels.insert("istio.io/dataplane-mode".into(), "none".into());
    let field = |n: &str, path: &str| EnvVar {
        name: n.into(),
        value: None,
        value_from: Some(EnvVarSource { field_ref: Some(FieldRef { field_path: path.into() }) }),
    };
    let container = Container {
        name: "istio-proxy".into(),
        command: vec!["slipstream".into(), "waypoint".into()],
        env: vec![
            field("POD_NAME", "metadata.name"),
            field("POD_NAMESPACE", "metadata.namespace"),
            field("INSTANCE_IP", "status.podIP"),
            field("NODE_NAME", "spec.nodeName"),
            EnvVar { name: "GATEWAY_NAME".into(), value: Some(name.clone()), value_from: None },
        ],
        ports: vec![
            ContainerPort { name: Some("mesh".into()), container_port: 15008, protocol: Protocol::TCP },
            ContainerPort { name: Some("status-port".into()), container_port: WAYPOINT_STATUS_PORT, protocol: Protocol::TCP },
        ],
        readiness_probe: Some(Probe {
            http_get: Some(HttpGetAction { path: Some("/healthz/ready".into()), port: IntOrString::Int(WAYPOINT_STATUS_PORT) }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: meta.clone(),
        spec: DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector { match_labels: [(GATEWAY_NAME_LABEL.to_string(), name.clone())].into(), match_expressions: vec![] },
            template: PodTemplateSpec {
                metadata: ObjectMeta { name: String::new(), namespace: String::new(), labels: pod_labels, annotations: Labels::new() },
                spec: PodSpec { containers: vec![container], service_account_name: Some(name.clone()), ..Default::default() },
            },
        },
    };
    let port = |n: &str, p: i64, app: Option<&str>| ServicePort {
        name: Some(n.into()),
        port: p,
        target_port: Some(IntOrString::Int(p)),
        protocol: Protocol::TCP,
        app_protocol: app.map(String::from),
    };
    let service = Service {
        metadata: meta.clone(),
        spec: ServiceSpec {
            selector: Some([(GATEWAY_NAME_LABEL.to_string(), name)].into()),
            ports: vec![port("status-port", WAYPOINT_STATUS_PORT, None), port("mesh", 15008, Some("hbone"))],
            cluster_ip: None,
            type_: None,
        },
    };
    Some(vec![Object::ServiceAccount(ServiceAccount { metadata: meta }), Object::Deployment(deployment), Object::Service(service)])
}

/// Labels only the waypoint Gateway controller sets on what it makes:
/// which pods are a waypoint, and which Service selects them. A user's
/// object may not carry them (`reserved_labels`), so that no pod template
/// a tenant writes can join a waypoint's Service or pass for one of its
/// pods.
pub const RESERVED_POD_LABELS: &[&str] = &[WAYPOINT_MANAGED_LABEL, GATEWAY_NAME_LABEL];

/// The fields of `o`, as a user applies it, that set a reserved label:
/// `metadata.labels[gateway.istio.io/managed]` on any object the
/// controller makes, and either reserved label on a pod or in a
/// Deployment's pod template (`spec.template.metadata.labels[...]`).
pub fn reserved_labels(o: &Object) -> Vec<String> {
    let field = |at: &str, k: &str| format!("{at}.labels[{k}]");
    let mut out = Vec::new();
    let (meta, template) = match o {
        Object::ServiceAccount(x) => (&x.metadata, None),
        Object::Service(x) => (&x.metadata, None),
        Object::Deployment(x) => (&x.metadata, Some(&x.spec.template.metadata)),
        Object::Pod(x) => (&x.metadata, Some(&x.metadata)),
        _ => return out,
    };
    if meta.labels.contains_key(WAYPOINT_MANAGED_LABEL) {
        out.push(field("metadata", WAYPOINT_MANAGED_LABEL));
    }
    if let Some(t) = template {
        let at = if matches!(o, Object::Pod(_)) { "metadata" } else { "spec.template.metadata" };
        for k in RESERVED_POD_LABELS.iter().filter(|k| t.labels.contains_key(**k)) {
            let f = field(at, k);
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// Whether an object was made for a waypoint Gateway. Only the agent's
/// own expansion carries the label: a user's object with it is refused
/// (`reserved_labels`).
pub fn is_waypoint_made(o: &Object) -> bool {
    let m = match o {
        Object::ServiceAccount(x) => &x.metadata,
        Object::Deployment(x) => &x.metadata,
        Object::Service(x) => &x.metadata,
        Object::Pod(x) => &x.metadata,
        _ => return false,
    };
    m.labels.get(WAYPOINT_MANAGED_LABEL).map(String::as_str) == Some(WAYPOINT_MANAGED_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{load_str, Source};

    #[test]
    fn reserved_labels_are_named_wherever_a_user_puts_them() {
        let rows: &[(&str, &[&str])] = &[
            // A pod template that passes for a waypoint's: both labels named.
            (
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: fake}\nspec:\n  selector: {matchLabels: {app: x}}\n  template:\n    metadata: {labels: {app: x, gateway.istio.io/managed: istio.io-mesh-controller, gateway.networking.k8s.io/gateway-name: waypoint}}\n    spec: {serviceAccountName: waypoint, containers: [{name: c, command: [sleep, infinity]}]}\n",
                &["spec.template.metadata.labels[gateway.istio.io/managed]", "spec.template.metadata.labels[gateway.networking.k8s.io/gateway-name]"],
            ),
            // The gateway-name label alone joins the waypoint's Service.
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {gateway.networking.k8s.io/gateway-name: waypoint}}\nspec: {containers: [{name: c, command: [sleep, infinity]}]}\n",
                &["metadata.labels[gateway.networking.k8s.io/gateway-name]"],
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {gateway.istio.io/managed: x}}\nspec: {containers: [{name: c, command: [sleep, infinity]}]}\n",
                &["metadata.labels[gateway.istio.io/managed]"],
            ),
            ("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: waypoint, labels: {gateway.istio.io/managed: istio.io-mesh-controller}}\n", &["metadata.labels[gateway.istio.io/managed]"]),
            // On a Deployment's own metadata only the managed label is reserved.
            (
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, labels: {gateway.networking.k8s.io/gateway-name: w}}\nspec:\n  selector: {matchLabels: {app: x}}\n  template:\n    metadata: {labels: {app: x}}\n    spec: {containers: [{name: c, command: [sleep, infinity]}]}\n",
                &[],
            ),
            ("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: waypoint}\n", &[]),
        ];
        for (yaml, want) in rows {
            let o = &load_str(yaml, &Source("t".into())).unwrap()[0].object;
            assert_eq!(reserved_labels(o), want.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{yaml}");
        }
        // What the agent's own expansion makes carries them, and is made.
        let gw = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: waypoint, namespace: shop}\nspec:\n  gatewayClassName: istio-waypoint\n  listeners: [{name: mesh, port: 15008, protocol: HBONE}]\n";
        let Object::Kept(k) = &load_str(gw, &Source("t".into())).unwrap()[0].object else { panic!("a Gateway is kept") };
        let made = waypoint_objects(k).unwrap();
        assert!(made.iter().all(is_waypoint_made));
        assert!(made.iter().all(|o| !reserved_labels(o).is_empty()), "a user could not apply them");
    }

    #[test]
    fn deployments_expand_to_replicas_with_template_hash() {
        let y = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 3\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: c, command: [sleep, infinity]}]}\n";
        let objs: Vec<Object> = load_str(y, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect();
        let pods = desired_pods(&objs);
        assert_eq!(pods.len(), 3);
        let names: std::collections::BTreeSet<_> = pods.iter().map(|p| p.name.clone()).collect();
        assert_eq!(names.len(), 3, "replica names are distinct");
        assert!(pods.iter().all(|p| p.labels["pod-template-hash"] == pods[0].spec_hash));
        assert!(pods.iter().all(|p| p.owner.as_deref() == Some("web")));
        // A changed template gives new pod names (the pods are replaced).
        let y2 = y.replace("infinity", "\"1000\"");
        let objs2: Vec<Object> = load_str(&y2, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect();
        let pods2 = desired_pods(&objs2);
        assert!(pods2.iter().all(|p| !names.contains(&p.name)));
    }

    #[test]
    fn selectors() {
        let l: Labels = [("app".into(), "a".into()), ("v".into(), "1".into())].into();
        assert!(selector_matches(&[("app".into(), "a".into())].into(), &l));
        assert!(!selector_matches(&[("app".into(), "b".into())].into(), &l));
        assert!(selector_matches(&Labels::new(), &l));
    }
}
