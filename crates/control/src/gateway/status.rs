//! What the gateway controller writes on Kubernetes objects, as Istio's
//! gateway and ambient controllers write them (the control plane on
//! Kubernetes through the API, `controller`; the local cluster's API view
//! on what `get` serves):
//!
//! - a waypoint Gateway (class `istio-waypoint`): `status.addresses` (its
//!   Service's ClusterIP) and the conditions `Accepted` (it passed `apply`,
//!   which refuses an invalid one naming the field) and `Programmed` (a pod
//!   of it is ready, so traffic bound to it flows), which `get gateway`
//!   shows as PROGRAMMED and `wait --for=condition=Programmed` waits for;
//! - a Service that asks for a waypoint: the condition
//!   `istio.io/WaypointBound`, `True` (`WaypointAccepted`) or `False` with
//!   the reason its traffic is refused (`WaypointNotFound`,
//!   `WaypointIsNotReady`, `UnsupportedTrafficType`, `AttachmentDenied`).
//!
//! The binding is decided by the control plane's own pure function
//! (`translate::waypoint::bind`), so what the status says is what the
//! node proxies were told. Pure: objects (as the API serves them) in, the
//! status each should have out.

use super::str_at;
use crate::translate::waypoint::{self as wp, Binding, Traffic, Waypoint};
use serde_json::{json, Value};
use slipstream_k8s::Labels;

/// The condition Istio writes on a Service bound (or refused) to a waypoint.
pub const WAYPOINT_BOUND: &str = "istio.io/WaypointBound";

fn labels_of(o: &Value) -> Labels {
    o["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

/// The message of a `True` [`WAYPOINT_BOUND`] condition (Istio's words),
/// by which readers such as `istioctl waypoint status` find the services
/// a waypoint serves.
pub fn bound_message(namespace: &str, name: &str) -> String {
    format!("bound to {namespace}/{name}")
}

/// The message of a `False` [`WAYPOINT_BOUND`] condition.
pub fn refused_message(namespace: &str, name: &str, why: &wp::NotBound) -> String {
    format!("waypoint {namespace}/{name}: {}; traffic to this service is refused until it is", refusal(why))
}

fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": reason, "message": message})
}

/// A pod of Gateway `ns/name` is ready: labelled with its name, running as
/// its account and, where `template` says what a waypoint's pods run
/// (Kubernetes), running that ([`super::genuine`]); a pod that only looks
/// like one does not make the Gateway `Programmed`.
fn gateway_ready(objects: &[Value], ns: &str, name: &str, template: Option<&super::render::DeploySettings>) -> bool {
    objects.iter().any(|p| {
        p["kind"] == "Pod"
            && str_at(p, "/metadata/namespace") == ns
            && p["metadata"]["labels"][wp::GATEWAY_NAME_LABEL].as_str() == Some(name)
            && str_at(p, "/spec/serviceAccountName") == name
            && template.is_none_or(|t| {
                let root = super::genuine::root_pem(&p["spec"]).unwrap_or_default().to_string();
                let t = super::render::pod_template(name, &super::render::DeploySettings { root_pem: root, ..t.clone() });
                super::genuine::differs(&p["spec"], &t["spec"]).is_none()
            })
            && p["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    })
}

/// Why a Gateway of the waypoint class is not a valid waypoint, if so.
pub fn invalid_waypoint(o: &Value) -> Option<String> {
    if o.pointer("/spec/gatewayClassName").and_then(Value::as_str) != Some(wp::WAYPOINT_CLASS) {
        return None;
    }
    let name = str_at(o, "/metadata/name");
    if !is_dns_label(name) {
        return Some(format!(
            "Gateway {}/{name}: metadata.name: a waypoint's name is also its Service's and ServiceAccount's: \
             at most 63 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit",
            str_at(o, "/metadata/namespace")
        ));
    }
    match crate::objects::parse_value(o.clone()) {
        Ok(Some(crate::objects::ClusterObject::Opaque(g))) => wp::gateway(&g).err().map(|e| e.to_string()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// A DNS-1035 label, what a Service's name must be.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The waypoints, as binding sees them.
fn waypoints(objects: &[Value], template: Option<&super::render::DeploySettings>) -> Vec<Waypoint> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Gateway")
        .filter_map(|o| {
            let Ok(Some(crate::objects::ClusterObject::Opaque(g))) = crate::objects::parse_value(o.clone()) else {
                return None;
            };
            let wp::GatewayInput::Waypoint { takes, allowed } = wp::gateway(&g).ok()? else { return None };
            let (ns, name) = (str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name"));
            Some(Waypoint { name: name.into(), namespace: ns.into(), takes, allowed, ready: gateway_ready(objects, ns, name, template) })
        })
        .collect()
}

/// The status the controllers write, by index into `objects`: for each
/// waypoint Gateway its whole `status` (`addresses`, `conditions`), for
/// each Service that asks for a waypoint `{"conditions": [WaypointBound]}`.
/// Conditions carry `type`, `status`, `reason` and `message` only; the
/// writer adds the times. `domain` is the cluster's DNS domain;
/// `template`, on Kubernetes, what a waypoint's pods run.
pub fn compute(objects: &[Value], domain: &str, template: Option<&super::render::DeploySettings>) -> Vec<(usize, Value)> {
    let waypoints = waypoints(objects, template);
    let namespace_labels: std::collections::BTreeMap<&str, Labels> =
        objects.iter().filter(|o| o["kind"] == "Namespace").map(|o| (str_at(o, "/metadata/name"), labels_of(o))).collect();
    let no_labels = Labels::new();
    let mut updates: Vec<(usize, Value)> = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        let (ns, name) = (str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name"));
        match o["kind"].as_str() {
            Some("Gateway") => {
                let Some(w) = waypoints.iter().find(|w| w.namespace == ns && w.name == name) else {
                    // A waypoint Gateway that does not read as one: said
                    // on it, naming the field (the local cluster refuses it
                    // at apply; Kubernetes admits it).
                    if let Some(why) = invalid_waypoint(o) {
                        updates.push((
                            i,
                            json!({"conditions": [condition("Accepted", false, "Invalid", &why), condition("Programmed", false, "Invalid", &why)]}),
                        ));
                    }
                    continue;
                };
                let ip = objects
                    .iter()
                    .find(|s| s["kind"] == "Service" && str_at(s, "/metadata/namespace") == ns && str_at(s, "/metadata/name") == name)
                    .map(|s| str_at(s, "/spec/clusterIP"))
                    .filter(|ip| !ip.is_empty() && *ip != "None");
                let programmed = if w.ready {
                    condition(
                        "Programmed",
                        true,
                        "Programmed",
                        &format!("Resource programmed, assigned to service(s) {name}.{ns}.svc.{}:{}", domain, wp::HBONE_LISTENER_PORT),
                    )
                } else {
                    condition("Programmed", false, "Pending", &format!("no pod of Deployment {ns}/{name} is ready yet"))
                };
                let mut status = json!({
                    "conditions": [condition("Accepted", true, "Accepted", "Resource accepted"), programmed],
                });
                if let Some(ip) = ip {
                    status["addresses"] = json!([{"type": "IPAddress", "value": ip}]);
                }
                updates.push((i, status));
            }
            Some("Service") => {
                let own = labels_of(o);
                let is_waypoint = own.contains_key(wp::GATEWAY_NAME_LABEL);
                let ns_labels = namespace_labels.get(ns).unwrap_or(&no_labels);
                let c = match wp::bind(Traffic::Service, ns, &own, ns_labels, is_waypoint, &waypoints) {
                    Binding::None => continue,
                    Binding::Bound { namespace, name } => {
                        condition(WAYPOINT_BOUND, true, "WaypointAccepted", &bound_message(&namespace, &name))
                    }
                    Binding::Refused { namespace, name, why } => {
                        condition(WAYPOINT_BOUND, false, why.reason(), &refused_message(&namespace, &name, &why))
                    }
                };
                updates.push((i, json!({"conditions": [c]})));
            }
            _ => {}
        }
    }
    updates
}

/// Writes the controllers' status on `objects` (see the module's doc),
/// merged into any status they have.
pub fn add(objects: &mut [Value], domain: &str) {
    for (i, status) in compute(objects, domain, None) {
        let o = &mut objects[i];
        match o.get_mut("status").and_then(Value::as_object_mut) {
            Some(existing) => {
                if let Value::Object(add) = status {
                    existing.extend(add);
                }
            }
            None => o["status"] = status,
        }
    }
}

fn refusal(why: &wp::NotBound) -> &'static str {
    match why {
        wp::NotBound::NotFound => "no Gateway of class istio-waypoint by that name",
        wp::NotBound::NotReady => "no pod of it is ready",
        wp::NotBound::WrongTraffic => "it does not take service traffic (istio.io/waypoint-for)",
        wp::NotBound::NotAllowed => "its listener does not allow this namespace (allowedRoutes)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    }
    fn svc(ns: &str, name: &str, labels: Value, ip: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"clusterIP": ip, "ports": [{"port": 80}]}})
    }
    fn gateway(ns: &str, name: &str, class: &str) -> Value {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": ns},
               "spec": {"gatewayClassName": class, "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}})
    }
    fn pod(ns: &str, name: &str, gateway: &str, ready: bool) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns,
               "labels": {wp::GATEWAY_NAME_LABEL: gateway}},
               "spec": {"serviceAccountName": gateway},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }
    fn cond<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
        o["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
    }
    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name).unwrap()
    }

    fn cluster(ready: bool) -> Vec<Value> {
        vec![
            ns("shop", json!({"istio.io/use-waypoint": "waypoint"})),
            gateway("shop", "waypoint", "istio-waypoint"),
            gateway("shop", "ingress", "istio"),
            svc("shop", "waypoint", json!({wp::GATEWAY_NAME_LABEL: "waypoint"}), "10.96.0.9"),
            pod("shop", "waypoint-abc", "waypoint", ready),
            svc("shop", "reviews", json!({}), "10.96.0.10"),
            svc("shop", "ratings", json!({"istio.io/use-waypoint": "none"}), "10.96.0.11"),
            svc("shop", "cart", json!({"istio.io/use-waypoint": "missing"}), "10.96.0.12"),
        ]
    }

    #[test]
    fn a_ready_waypoint_is_programmed_and_its_services_bound() {
        let mut objects = cluster(true);
        add(&mut objects, "cluster.local");
        let gw = find(&objects, "Gateway", "waypoint");
        assert_eq!(cond(gw, "Accepted").unwrap()["status"], "True");
        let p = cond(gw, "Programmed").unwrap();
        assert_eq!(p["status"], "True");
        assert!(p["message"].as_str().unwrap().contains("waypoint.shop.svc.cluster.local:15008"), "{p}");
        assert_eq!(gw["status"]["addresses"], json!([{"type": "IPAddress", "value": "10.96.0.9"}]));
        // A Gateway of another class has no controller here: no status.
        assert!(find(&objects, "Gateway", "ingress").get("status").is_none());
        // Bound through the namespace's label.
        let b = cond(find(&objects, "Service", "reviews"), WAYPOINT_BOUND).unwrap();
        assert_eq!((b["status"].as_str(), b["reason"].as_str()), (Some("True"), Some("WaypointAccepted")));
        assert_eq!(b["message"], "bound to shop/waypoint");
        // Opted out, and the waypoint's own Service: no condition.
        assert!(cond(find(&objects, "Service", "ratings"), WAYPOINT_BOUND).is_none());
        assert!(cond(find(&objects, "Service", "waypoint"), WAYPOINT_BOUND).is_none());
        // A waypoint that does not exist: refused, and said so.
        let m = cond(find(&objects, "Service", "cart"), WAYPOINT_BOUND).unwrap();
        assert_eq!((m["status"].as_str(), m["reason"].as_str()), (Some("False"), Some("WaypointNotFound")));
        assert!(m["message"].as_str().unwrap().contains("shop/missing"), "{m}");
    }

    #[test]
    fn a_waypoint_without_a_ready_pod_is_not_programmed_and_binds_nothing() {
        let mut objects = cluster(false);
        add(&mut objects, "cluster.local");
        let p = cond(find(&objects, "Gateway", "waypoint"), "Programmed").unwrap();
        assert_eq!((p["status"].as_str(), p["reason"].as_str()), (Some("False"), Some("Pending")));
        let b = cond(find(&objects, "Service", "reviews"), WAYPOINT_BOUND).unwrap();
        assert_eq!((b["status"].as_str(), b["reason"].as_str()), (Some("False"), Some("WaypointIsNotReady")));
    }

    #[test]
    fn an_invalid_waypoint_gateway_is_not_accepted_and_says_which_field() {
        let mut objects = cluster(true);
        objects[1]["spec"]["listeners"][0]["port"] = json!(8080);
        add(&mut objects, "cluster.local");
        let a = cond(find(&objects, "Gateway", "waypoint"), "Accepted").unwrap();
        assert_eq!((a["status"].as_str(), a["reason"].as_str()), (Some("False"), Some("Invalid")));
        assert!(a["message"].as_str().unwrap().contains("spec.listeners[0].port"), "{a}");
        // Its services are refused: there is no waypoint by that name.
        let b = cond(find(&objects, "Service", "reviews"), WAYPOINT_BOUND).unwrap();
        assert_eq!(b["reason"], "WaypointNotFound");
    }

    #[test]
    fn a_waypoint_whose_name_cannot_be_a_service_name_is_not_accepted() {
        for bad in ["wp.v1", "1wp", "Waypoint", &"w".repeat(64)] {
            let mut g = gateway("shop", bad, "istio-waypoint");
            g["metadata"]["name"] = json!(bad);
            assert!(invalid_waypoint(&g).is_some_and(|m| m.contains("metadata.name")), "{bad}");
        }
        assert!(invalid_waypoint(&gateway("shop", "waypoint-2", "istio-waypoint")).is_none());
    }

    #[test]
    fn a_waypoint_for_workloads_only_refuses_a_service() {
        let mut objects = cluster(true);
        objects[1]["metadata"]["labels"] = json!({"istio.io/waypoint-for": "workload"});
        add(&mut objects, "cluster.local");
        let b = cond(find(&objects, "Service", "reviews"), WAYPOINT_BOUND).unwrap();
        assert_eq!(b["reason"], "UnsupportedTrafficType");
    }
}
