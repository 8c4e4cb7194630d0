//! The bench cluster's manifests: per scenario a namespace with the same two
//! pods, a server pinned to node2 (fortio's HTTP and TCP echo servers, and
//! iperf3) behind a Service, and a client pinned to node1. Pure.

use crate::scenario::{Scenario, Setup};

pub const CLIENT: &str = "client";
pub const SERVER: &str = "server";
pub const CLIENT_NODE: &str = "node1";
pub const SERVER_NODE: &str = "node2";
pub const NODES: usize = 2;
pub const HTTP_PORT: u16 = 8080;
pub const IPERF_PORT: u16 = 5201;
/// fortio's TCP echo server: the target of the held connections (R1).
pub const TCP_ECHO_PORT: u16 = 8078;
pub use crate::scenario::WAYPOINT;

/// What S1's container runs (on Kubernetes: `crate::kube::objects`):
/// `started` (when the container is running), then a request to the
/// server until one is answered. curl writes `served <code>` when each
/// attempt ends (`000` when none was answered), so the first `served 2xx`
/// line is the first answer; the container runtime timestamps each line as
/// it is written.
pub const POD_START_LOOP: &str =
    "echo started; until curl -sf -o /dev/null --max-time 5 -w 'served %{http_code}\\n' http://server:8080/; do sleep 0.01; done";

/// YAML for every measurable scenario among `scenarios`.
pub fn render(scenarios: &[&Scenario]) -> String {
    let mut docs = Vec::new();
    for s in scenarios {
        if let Setup::Namespace { namespace, labels } = s.setup {
            docs.push(namespace_doc(namespace, labels));
            if labels.iter().any(|(k, _)| *k == "istio.io/use-waypoint") {
                docs.push(waypoint_doc(namespace));
            }
            docs.push(server_doc(namespace));
            docs.push(service_doc(namespace));
            docs.push(client_doc(namespace));
        }
    }
    docs.join("---\n")
}

fn namespace_doc(ns: &str, labels: &[(&str, &str)]) -> String {
    let mut s = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n");
    if !labels.is_empty() {
        s.push_str("  labels:\n");
        for (k, v) in labels {
            s.push_str(&format!("    {k}: {v}\n"));
        }
    }
    s
}

fn waypoint_doc(ns: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {WAYPOINT}
  namespace: {ns}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {{name: mesh, port: 15008, protocol: HBONE}}
"
    )
}

fn server_doc(ns: &str) -> String {
    // No readiness probe on iperf3: its server runs one test at a time and a
    // probe's connection would disturb a running test.
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {SERVER}
  namespace: {ns}
  labels: {{app: {SERVER}}}
spec:
  nodeName: {SERVER_NODE}
  containers:
  - name: fortio
    command: [fortio, server, -http-port, \"{HTTP_PORT}\", -tcp-port, \"{TCP_ECHO_PORT}\", -grpc-port, disabled, -redirect-port, disabled, -udp-port, disabled]
    ports:
    - {{name: http, containerPort: {HTTP_PORT}}}
    - {{name: tcp-echo, containerPort: {TCP_ECHO_PORT}}}
    readinessProbe:
      tcpSocket: {{port: {HTTP_PORT}}}
  - name: iperf3
    command: [iperf3, -s, -p, \"{IPERF_PORT}\"]
    ports:
    - {{name: iperf, containerPort: {IPERF_PORT}}}
"
    )
}

fn service_doc(ns: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {SERVER}
  namespace: {ns}
spec:
  selector: {{app: {SERVER}}}
  ports:
  - {{name: http, port: {HTTP_PORT}, targetPort: {HTTP_PORT}}}
  - {{name: iperf, port: {IPERF_PORT}, targetPort: {IPERF_PORT}}}
  - {{name: tcp-echo, port: {TCP_ECHO_PORT}, targetPort: {TCP_ECHO_PORT}}}
"
    )
}

fn client_doc(ns: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {CLIENT}
  namespace: {ns}
spec:
  nodeName: {CLIENT_NODE}
  containers:
  - name: client
    command: [sleep, infinity]
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::SCENARIOS;

    #[test]
    fn one_namespace_per_measurable_scenario_with_its_labels() {
        let all: Vec<&Scenario> = SCENARIOS.iter().collect();
        let y = render(&all);
        assert_eq!(y.matches("kind: Namespace").count(), 4);
        assert_eq!(y.matches("kind: Pod").count(), 8);
        assert_eq!(y.matches("kind: Service").count(), 4);
        assert_eq!(y.matches("kind: Gateway").count(), 1, "the l7 namespace has its waypoint");
        assert!(
            y.contains("  name: bench-none\n  labels:\n    slipstream.io/datapath: nftables\n---"),
            "the baseline namespace is outside the mesh and off BPF:\n{y}"
        );
        assert!(
            y.contains("  name: bench-l4\n  labels:\n    istio.io/dataplane-mode: ambient\n    slipstream.io/datapath: nftables\n"),
            "{y}"
        );
        assert!(y.contains("  name: bench-l4e\n  labels:\n    istio.io/dataplane-mode: ambient\n---"), "{y}");
        assert_eq!(y.matches("nodeName: node2").count(), 4);
        assert_eq!(y.matches("nodeName: node1").count(), 4);
    }

    #[test]
    fn manifests_load_and_validate() {
        let all: Vec<&Scenario> = SCENARIOS.iter().collect();
        let loaded =
            slipstream_k8s::load_str(&render(&all), &slipstream_k8s::Source("bench.yaml".into())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.len(), 17);
        assert!(loaded.iter().all(|l| l.warnings.is_empty()), "no warnings");
    }

    #[test]
    fn documents_are_separated() {
        let none: Vec<&Scenario> = SCENARIOS.iter().take(1).collect();
        let y = render(&none);
        assert_eq!(y.split("---\n").count(), 4);
        for d in y.split("---\n") {
            assert!(d.starts_with("apiVersion: v1\nkind: "), "{d}");
        }
    }
}
