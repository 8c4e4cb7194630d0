//! Inputs for the views' tests, from YAML as the index receives it.

use crate::translate::{self, Input, PodInput, ServiceInput, SliceInput};

/// The input of the one object `y` holds.
pub(super) fn input(y: &str) -> Input {
    let mut objects = translate::parse_manifests(y).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(objects.len(), 1);
    translate::input(&objects.remove(0)).unwrap_or_else(|e| panic!("{e:?}"))
}

/// A running pod with `labels` (YAML flow mapping body) at `ip`.
pub(super) fn pod(ns: &str, name: &str, labels: &str, ip: &str) -> PodInput {
    let y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, ports: [{{name: http, containerPort: 8080}}]}}]\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n"
    );
    match input(&y) {
        Input::Pod(p) => p,
        other => panic!("{other:?}"),
    }
}

/// A Service of port 80 to `http`, selecting `selector` (none if empty).
pub(super) fn service(ns: &str, name: &str, selector: &str) -> ServiceInput {
    let selector = if selector.is_empty() { String::new() } else { format!("selector: {{{selector}}}, ") };
    let y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{{selector}clusterIP: 10.96.0.9, ports: [{{name: http, port: 80, targetPort: http}}]}}\n"
    );
    match input(&y) {
        Input::Service(s) => s,
        other => panic!("{other:?}"),
    }
}

/// An EndpointSlice of `service` naming `pod` at `ip`, port `http` 9090.
pub(super) fn slice(ns: &str, name: &str, service: &str, pod: &str, ip: &str) -> SliceInput {
    let y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: {ns}, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 9090, protocol: TCP}}]\nendpoints: [{{addresses: [{ip}], targetRef: {{kind: Pod, name: {pod}, namespace: {ns}}}}}]\n"
    );
    match input(&y) {
        Input::EndpointSlice(s) => s,
        other => panic!("{other:?}"),
    }
}
