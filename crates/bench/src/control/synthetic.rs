//! The synthetic cluster of `bench-control`: Namespaces, Services, Pods and
//! AuthorizationPolicies as manifests, one file per object laid out as the
//! local cluster's agent writes them (`<Kind>/<namespace>/<name>.yaml`),
//! so the control plane reads them through its ordinary `dir` source.
//!
//! Pure: the text of every file and of each pod change. The shape:
//! `namespaces` namespaces `ns0..`, all ambient; service `sJ` in namespace
//! `ns(J % namespaces)` selecting `app: aJ`; pod `pI` backs service
//! `I % services` (so it lives in that service's namespace and carries its
//! `app` label), runs on node `node(I % nodes + 1)` as a ReplicaSet's pod,
//! ready; policy `kJ` in the namespace of service `J % services` selects
//! that service's pods and allows two source namespaces on two ports.

use std::fmt::Write as _;
use std::path::PathBuf;

/// How big the cluster is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub pods: usize,
    pub services: usize,
    pub policies: usize,
    pub namespaces: usize,
    /// Nodes `node1..nodeN`, one simulated proxy each.
    pub nodes: usize,
}

/// One manifest file, relative to the object directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: PathBuf,
    pub text: String,
}

/// What the `n`th pod change does to its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodChange {
    /// Its Ready condition turns False.
    NotReady,
    /// A new `service.istio.io/canonical-revision` label (`v<n>`).
    Revision(usize),
}

/// The cluster of one shape.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub shape: Shape,
    pub cluster_id: String,
}

impl Cluster {
    /// Namespaces, services and pods are at least 1 each, nodes too.
    pub fn new(shape: Shape, cluster_id: &str) -> Cluster {
        let shape = Shape {
            namespaces: shape.namespaces.max(1),
            services: shape.services.max(1),
            nodes: shape.nodes.max(1),
            pods: shape.pods.max(1),
            ..shape
        };
        Cluster { shape, cluster_id: cluster_id.to_string() }
    }

    pub fn node(&self, n: usize) -> String {
        format!("node{}", n + 1)
    }

    fn service_namespace(&self, s: usize) -> String {
        format!("ns{}", s % self.shape.namespaces)
    }

    fn pod_service(&self, p: usize) -> usize {
        p % self.shape.services
    }

    /// Namespace and name of pod `p`.
    pub fn pod_name(&self, p: usize) -> (String, String) {
        (self.service_namespace(self.pod_service(p)), format!("p{p}"))
    }

    /// The name of pod `p`'s workload resource (`<cluster>//Pod/<ns>/<name>`).
    pub fn workload_name(&self, p: usize) -> String {
        let (ns, name) = self.pod_name(p);
        format!("{}//Pod/{ns}/{name}", self.cluster_id)
    }

    /// Every file of the cluster: namespaces, then services, policies, pods.
    pub fn files(&self) -> Vec<File> {
        let s = &self.shape;
        let mut out = Vec::with_capacity(s.namespaces + s.services + s.policies + s.pods);
        for n in 0..s.namespaces {
            out.push(File {
                path: format!("Namespace/ns{n}.yaml").into(),
                text: format!(
                    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns{n}\n  labels:\n    istio.io/dataplane-mode: ambient\n"
                ),
            });
        }
        for j in 0..s.services {
            out.push(self.service(j));
        }
        for j in 0..s.policies {
            out.push(self.policy(j));
        }
        for p in 0..s.pods {
            out.push(self.pod(p, None));
        }
        out
    }

    fn service(&self, j: usize) -> File {
        let ns = self.service_namespace(j);
        // 10.96.0.0/12, from 10.96.0.10 on.
        let v = j + 10;
        let vip = format!("10.{}.{}.{}", 96 + v / 65536, (v / 256) % 256, v % 256);
        File {
            path: format!("Service/{ns}/s{j}.yaml").into(),
            text: format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: s{j}\n  namespace: {ns}\nspec:\n  selector:\n    app: a{j}\n  \
                 clusterIP: {vip}\n  clusterIPs: [{vip}]\n  ports:\n  - {{name: http, port: 80, targetPort: http}}\n  \
                 - {{name: grpc, port: 9090, targetPort: 9090}}\n"
            ),
        }
    }

    fn policy(&self, j: usize) -> File {
        let s = j % self.shape.services;
        let ns = self.service_namespace(s);
        let n = self.shape.namespaces;
        File {
            path: format!("AuthorizationPolicy/{ns}/k{j}.yaml").into(),
            text: format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: k{j}\n  namespace: {ns}\nspec:\n  \
                 selector:\n    matchLabels:\n      app: a{s}\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        \
                 namespaces: [ns{}, ns{}]\n    to:\n    - operation:\n        ports: [\"8080\", \"9090\"]\n",
                (j + 1) % n,
                (j + 2) % n
            ),
        }
    }

    /// Pod `p`'s file, as first written (`None`) or after a change.
    pub fn pod(&self, p: usize, change: Option<PodChange>) -> File {
        let (ns, name) = self.pod_name(p);
        let s = self.pod_service(p);
        let node = p % self.shape.nodes;
        let ip = format!("10.{}.{}.{}", 1 + p / 65536, (p / 256) % 256, p % 256);
        let host_ip = format!("172.18.{}.{}", (node + 1) / 256, (node + 1) % 256);
        let ready = if change == Some(PodChange::NotReady) { "False" } else { "True" };
        let mut labels = format!("    app: a{s}\n    pod-template-hash: 7c9d8\n");
        if let Some(PodChange::Revision(n)) = change {
            let _ = writeln!(labels, "    service.istio.io/canonical-revision: v{n}");
        }
        File {
            path: format!("Pod/{ns}/{name}.yaml").into(),
            text: format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n{labels}  ownerReferences:\n  \
                 - {{apiVersion: apps/v1, kind: ReplicaSet, name: d{s}-7c9d8, uid: rs-{s}, controller: true}}\nspec:\n  \
                 nodeName: {node_name}\n  serviceAccountName: sa{s}\n  containers:\n  - name: app\n    image: app\n    \
                 ports:\n    - {{name: http, containerPort: 8080}}\n    - {{name: grpc, containerPort: 9090}}\nstatus:\n  \
                 phase: Running\n  hostIP: {host_ip}\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  conditions:\n  \
                 - {{type: Ready, status: \"{ready}\"}}\n",
                node_name = self.node(node),
            ),
        }
    }

    /// The pod the `i`th change of a run touches, and what it does: a new
    /// pod each time, spread over namespaces and nodes; readiness and a
    /// label in turn.
    pub fn change(&self, i: usize) -> (usize, PodChange) {
        // A stride coprime with most pod counts walks over all of them.
        let p = (i * 7919 + 13) % self.shape.pods;
        let what = if i % 2 == 0 { PodChange::NotReady } else { PodChange::Revision(i) };
        (p, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        Cluster::new(Shape { pods: 20, services: 4, policies: 6, namespaces: 3, nodes: 5 }, "c1")
    }

    #[test]
    fn pods_back_their_service_and_spread_over_nodes() {
        let c = cluster();
        let files = c.files();
        assert_eq!(files.len(), 3 + 4 + 6 + 20);
        let p6 = c.pod(6, None);
        // Pod 6 backs service 2 (in ns2) and runs on node2.
        assert_eq!(p6.path, PathBuf::from("Pod/ns2/p6.yaml"));
        assert!(p6.text.contains("app: a2\n") && p6.text.contains("nodeName: node2\n"), "{}", p6.text);
        assert!(files.iter().any(|f| f.path == std::path::Path::new("Service/ns2/s2.yaml") && f.text.contains("app: a2")));
        assert_eq!(c.workload_name(6), "c1//Pod/ns2/p6");
        let changed = c.pod(6, Some(PodChange::Revision(3)));
        assert_ne!(changed.text, p6.text);
        assert!(changed.text.contains("canonical-revision: v3"));
    }

    #[test]
    fn changes_touch_different_pods() {
        let c = Cluster::new(Shape { pods: 10_000, services: 1000, policies: 1000, namespaces: 100, nodes: 100 }, "c");
        let pods: std::collections::BTreeSet<usize> = (0..100).map(|i| c.change(i).0).collect();
        assert_eq!(pods.len(), 100);
        assert_eq!(c.change(0).1, PodChange::NotReady);
        assert_eq!(c.change(1).1, PodChange::Revision(1));
    }
}
