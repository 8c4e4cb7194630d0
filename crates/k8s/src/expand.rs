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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{load_str, Source};

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
