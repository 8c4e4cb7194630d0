//! The objects a Kubernetes run creates, as JSON the API server takes: per
//! scenario a namespace with its labels, the server pod (fortio's HTTP and
//! TCP echo servers, an iperf3 server) on one node behind the Service
//! `server`, the client pod (fortio and iperf3, idle until the bench execs
//! them) on the other, the waypoint of `l7`; and S1's pods. Pure.

use crate::manifests::{CLIENT, HTTP_PORT, IPERF_PORT, SERVER, TCP_ECHO_PORT, WAYPOINT};
use serde_json::{json, Value};

/// fortio, the version BENCHMARKS.md pins (scripts/kube-images.sh pushes
/// the one scripts/setup.sh installed under this name).
pub const FORTIO_IMAGE: &str = "docker.io/fortio/fortio:1.63.0";
/// iperf3 (scripts/kube-images.sh: Debian's).
pub const IPERF_IMAGE: &str = "docker.io/networkstatic/iperf3:3.12";
/// curl, for S1's pods (scripts/kube-images.sh: Debian's curl and sh).
pub const CURL_IMAGE: &str = "docker.io/curlimages/curl:7.88.1";

/// The client pod's containers the experiments run in.
pub const FORTIO_CONTAINER: &str = "fortio";
pub const IPERF_CONTAINER: &str = "iperf3";

/// Label of S1's pods (`app=<it>`).
pub const POD_START_APP: &str = "pod-start";

pub use crate::manifests::POD_START_LOOP;

pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn on_node(node: &str) -> Value {
    json!({"kubernetes.io/hostname": node})
}

/// The server: fortio's HTTP (8080) and TCP echo (8078) servers and an
/// iperf3 server (5201), no readiness probe on iperf3 (its server runs one
/// test at a time: a probe's connection would disturb a running test).
pub fn server(ns: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": SERVER, "namespace": ns, "labels": {"app": SERVER}},
        "spec": {
            "nodeSelector": on_node(node),
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": FORTIO_CONTAINER, "image": FORTIO_IMAGE,
                 "command": ["fortio", "server", "-http-port", HTTP_PORT.to_string(), "-tcp-port", TCP_ECHO_PORT.to_string(),
                             "-grpc-port", "disabled", "-redirect-port", "disabled", "-udp-port", "disabled"],
                 "ports": [{"name": "http", "containerPort": HTTP_PORT}, {"name": "tcp-echo", "containerPort": TCP_ECHO_PORT}],
                 "readinessProbe": {"tcpSocket": {"port": HTTP_PORT}, "periodSeconds": 1}},
                {"name": IPERF_CONTAINER, "image": IPERF_IMAGE,
                 "command": ["iperf3", "-s", "-p", IPERF_PORT.to_string()],
                 "ports": [{"name": "iperf", "containerPort": IPERF_PORT}]}
            ]
        }
    })
}

pub fn service(ns: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVER, "namespace": ns},
        "spec": {
            "selector": {"app": SERVER},
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT},
                {"name": "iperf", "port": IPERF_PORT, "targetPort": IPERF_PORT},
                {"name": "tcp-echo", "port": TCP_ECHO_PORT, "targetPort": TCP_ECHO_PORT}
            ]
        }
    })
}

/// The client: its images have no `sleep`, so each container idles as a
/// server of its own (nothing connects to them) while the bench execs the
/// experiments' clients in it.
pub fn client(ns: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CLIENT, "namespace": ns, "labels": {"app": CLIENT}},
        "spec": {
            "nodeSelector": on_node(node),
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": FORTIO_CONTAINER, "image": FORTIO_IMAGE,
                 "command": ["fortio", "server", "-http-port", HTTP_PORT.to_string(), "-tcp-port", "disabled",
                             "-grpc-port", "disabled", "-redirect-port", "disabled", "-udp-port", "disabled"]},
                {"name": IPERF_CONTAINER, "image": IPERF_IMAGE, "command": ["iperf3", "-s", "-p", IPERF_PORT.to_string()]}
            ]
        }
    })
}

/// `l7`'s waypoint: a Gateway of class `istio-waypoint`, which the
/// control plane turns into a Deployment in the namespace.
pub fn waypoint(ns: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": WAYPOINT, "namespace": ns},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}
    })
}

/// S1's pod number `n` of repetition `rep`, on the client's node.
pub fn pod_start(ns: &str, node: &str, rep: u32, n: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_start_name(rep, n), "namespace": ns, "labels": {"app": POD_START_APP}},
        "spec": {
            "nodeSelector": on_node(node),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "curl", "image": CURL_IMAGE, "command": ["sh", "-c", POD_START_LOOP]}]
        }
    })
}

pub fn pod_start_name(rep: u32, n: u32) -> String {
    format!("{POD_START_APP}-{rep}-{n}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Pod, Service};

    #[test]
    fn objects_are_what_the_api_server_takes() {
        let pods = [server("bench-none", "worker-2"), client("bench-none", "worker-1"), pod_start("bench-none", "worker-1", 1, 7)];
        for p in pods {
            let pod: Pod = serde_json::from_value(p.clone()).unwrap_or_else(|e| panic!("{e}: {p}"));
            assert_eq!(pod.metadata.namespace.as_deref(), Some("bench-none"));
        }
        let s: Service = serde_json::from_value(service("bench-mesh")).unwrap();
        let ports: Vec<i32> = s.spec.unwrap().ports.unwrap().iter().map(|p| p.port).collect();
        assert_eq!(ports, [8080, 5201, 8078]);
        let ns: Namespace = serde_json::from_value(namespace("bench-mesh", &[("istio.io/dataplane-mode", "ambient")])).unwrap();
        assert_eq!(ns.metadata.labels.unwrap()["istio.io/dataplane-mode"], "ambient");
        let none: Namespace = serde_json::from_value(namespace("bench-none", &[])).unwrap();
        assert!(none.metadata.labels.unwrap_or_default().is_empty());
    }

    #[test]
    fn pods_go_where_they_are_told() {
        let table = [
            (server("a", "worker-2"), "worker-2", vec![FORTIO_IMAGE, IPERF_IMAGE]),
            (client("a", "worker-1"), "worker-1", vec![FORTIO_IMAGE, IPERF_IMAGE]),
            (pod_start("a", "worker-1", 2, 3), "worker-1", vec![CURL_IMAGE]),
        ];
        for (pod, node, images) in table {
            assert_eq!(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"], node);
            let got: Vec<&str> = pod["spec"]["containers"].as_array().unwrap().iter().map(|c| c["image"].as_str().unwrap()).collect();
            assert_eq!(got, images);
        }
    }

    #[test]
    fn pod_start_pods_run_once_and_stop_at_the_first_answer() {
        let p = pod_start("bench-mesh", "worker-1", 2, 13);
        assert_eq!(p["metadata"]["name"], "pod-start-2-13");
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        assert_eq!(p["spec"]["containers"][0]["command"][2], POD_START_LOOP);
        assert!(POD_START_LOOP.starts_with("echo started; until curl -sf "), "-f: an HTTP error is not an answer");
        assert!(POD_START_LOOP.contains("http://server:8080/"));
    }

    #[test]
    fn server_names_its_ports_and_probes_only_http() {
        let p = server("bench-l7", "worker-2");
        let c = &p["spec"]["containers"];
        assert_eq!(c[0]["readinessProbe"]["tcpSocket"]["port"], 8080);
        assert!(c[1].get("readinessProbe").is_none());
        assert_eq!(waypoint("bench-l7")["spec"]["gatewayClassName"], "istio-waypoint");
    }
}
