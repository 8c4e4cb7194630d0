//! What a waypoint Gateway makes on Kubernetes, as Istio's gateway
//! controller makes it: a ServiceAccount (the waypoint's identity), a
//! Deployment of `slipstream waypoint` outside the mesh, and a ClusterIP
//! Service with its HBONE port `mesh` (15008) and `status-port` (15021),
//! all named after the Gateway, labelled as Istio labels them and owned by
//! the Gateway (`ownerReferences`), so Kubernetes deletes them with it.
//!
//! The local cluster makes the same three objects from its own model
//! (`slipstream_k8s::expand::waypoint_objects`); this one adds what a real
//! kubelet needs: the image, a projected ServiceAccount token for the CA's
//! audience (the waypoint's credential, reviewed with TokenReview), a
//! locked-down security context. Pure: the Gateway as the API serves it in,
//! the objects to apply out.

use super::str_at;
use crate::translate::waypoint as wp;
use serde_json::{json, Value};
use slipstream_k8s::expand::{GATEWAY_NAME_LABEL, WAYPOINT_MANAGED_LABEL, WAYPOINT_MANAGED_VALUE, WAYPOINT_STATUS_PORT};

/// Where the projected token is mounted, and its file name.
pub const TOKEN_DIR: &str = "/var/run/secrets/tokens";
pub const TOKEN_FILE: &str = "istio-token";
/// The projected token's lifetime (the kubelet renews it at 80 %).
pub const TOKEN_SECONDS: i64 = 43_200;
/// The unprivileged user the waypoint runs as (Istio's proxy user).
pub const WAYPOINT_UID: i64 = 1337;

/// How the made Deployment reaches the control plane and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploySettings {
    /// The image with `slipstream` on its PATH.
    pub image: String,
    /// `host:port` of the control plane (its Service), as the waypoint dials it.
    pub control_plane: String,
    /// The name on the control plane's certificate.
    pub control_plane_san: String,
    /// The mesh root bundle, PEM (public: the waypoint verifies the
    /// control plane with it until the CA's answers carry the roots).
    pub root_pem: String,
    pub trust_domain: String,
    pub cluster_id: String,
    /// The audience of the projected token (the CA's TokenReview audience).
    pub audience: String,
}

/// Whether `gw` is a Gateway of the waypoint class.
pub fn is_waypoint_gateway(gw: &Value) -> bool {
    gw["kind"] == "Gateway" && str_at(gw, "/spec/gatewayClassName") == wp::WAYPOINT_CLASS
}

/// The objects to apply for `gw`: ServiceAccount, Deployment, Service.
/// None for a Gateway of another class, or one the API server has not
/// given a uid (its owner reference needs one).
pub fn objects(gw: &Value, s: &DeploySettings) -> Option<Vec<Value>> {
    if !is_waypoint_gateway(gw) {
        return None;
    }
    let (ns, name, uid) = (str_at(gw, "/metadata/namespace"), str_at(gw, "/metadata/name"), str_at(gw, "/metadata/uid"));
    if ns.is_empty() || name.is_empty() || uid.is_empty() {
        return None;
    }
    let labels = json!({ WAYPOINT_MANAGED_LABEL: WAYPOINT_MANAGED_VALUE, GATEWAY_NAME_LABEL: name });
    let metadata = json!({
        "name": name,
        "namespace": ns,
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "name": name,
            "uid": uid,
            "controller": true,
            // No blockOwnerDeletion: it would need `update` on
            // gateways/finalizers where OwnerReferencesPermissionEnforcement
            // is on, and background deletion collects the objects anyway.
        }],
    });
    let template = pod_template(name, s);
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            // No `replicas`: the API server defaults it to 1, and an
            // autoscaler or `kubectl scale` owns it from then on (applying
            // it would undo them at every resync).
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: name}},
            "template": template,
        },
    });
    let port = |n: &str, p: i64, app: Option<&str>| {
        let mut v = json!({"name": n, "port": p, "targetPort": p, "protocol": "TCP"});
        if let Some(a) = app {
            v["appProtocol"] = json!(a);
        }
        v
    };
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": {GATEWAY_NAME_LABEL: name},
            "ports": [port("status-port", WAYPOINT_STATUS_PORT, None), port("mesh", i64::from(wp::HBONE_LISTENER_PORT), Some("hbone"))],
        },
    });
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata});
    Some(vec![account, deployment, service])
}

/// The pod template of waypoint Gateway `name`'s Deployment (the same in
/// every namespace):
/// what the ReplicaSet controller copies into each of its pods, and what
/// the control plane compares a caller's pod with before it treats that
/// pod as the waypoint ([`super::genuine`]).
pub fn pod_template(name: &str, s: &DeploySettings) -> Value {
    let labels = json!({ WAYPOINT_MANAGED_LABEL: WAYPOINT_MANAGED_VALUE, GATEWAY_NAME_LABEL: name });
    let field = |env: &str, path: &str| json!({"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let value = |env: &str, v: &str| json!({"name": env, "value": v});
    let container = json!({
        "name": "istio-proxy",
        "image": s.image,
        "command": ["slipstream", "waypoint"],
        "env": [
            field("POD_NAME", "metadata.name"),
            field("POD_NAMESPACE", "metadata.namespace"),
            field("INSTANCE_IP", "status.podIP"),
            field("NODE_NAME", "spec.nodeName"),
            value("GATEWAY_NAME", name),
            value("SLIPSTREAM_WAYPOINT_CONTROL_PLANE", &s.control_plane),
            value("SLIPSTREAM_WAYPOINT_CONTROL_PLANE_SAN", &s.control_plane_san),
            value("SLIPSTREAM_WAYPOINT_ROOT_PEM", &s.root_pem),
            value("SLIPSTREAM_WAYPOINT_TOKEN_FILE", &format!("{TOKEN_DIR}/{TOKEN_FILE}")),
            value("SLIPSTREAM_WAYPOINT_TRUST_DOMAIN", &s.trust_domain),
            value("SLIPSTREAM_WAYPOINT_CLUSTER_ID", &s.cluster_id),
        ],
        "ports": [
            {"name": "mesh", "containerPort": wp::HBONE_LISTENER_PORT, "protocol": "TCP"},
            {"name": "status-port", "containerPort": WAYPOINT_STATUS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": WAYPOINT_STATUS_PORT},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "runAsUser": WAYPOINT_UID,
            "runAsGroup": WAYPOINT_UID,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "istio-token", "mountPath": TOKEN_DIR, "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    });
    let mut pod_labels = labels.clone();
    pod_labels["istio.io/dataplane-mode"] = json!("none");
    json!({
        "metadata": {"labels": pod_labels},
        "spec": {
            "serviceAccountName": name,
            // The waypoint needs no API token: its only credential
            // is the projected one, for the CA's audience.
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            // Admitted under the `restricted` Pod Security Standard.
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [
                {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
                    "audience": s.audience, "expirationSeconds": TOKEN_SECONDS, "path": TOKEN_FILE,
                }}]}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn gateway(class: &str) -> Value {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "waypoint", "namespace": "shop", "uid": "u-1"},
               "spec": {"gatewayClassName": class, "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}})
    }

    fn env<'a>(d: &'a Value, name: &str) -> &'a Value {
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        c["env"].as_array().unwrap().iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no env {name}"))
    }

    #[test]
    fn a_waypoint_gateway_makes_three_owned_objects_named_after_it() {
        let made = objects(&gateway("istio-waypoint"), &settings()).unwrap();
        let kinds: Vec<&str> = made.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ServiceAccount", "Deployment", "Service"]);
        for o in &made {
            assert_eq!((o["metadata"]["name"].as_str(), o["metadata"]["namespace"].as_str()), (Some("waypoint"), Some("shop")));
            assert_eq!(o["metadata"]["labels"][WAYPOINT_MANAGED_LABEL], WAYPOINT_MANAGED_VALUE);
            assert_eq!(o["metadata"]["labels"][GATEWAY_NAME_LABEL], "waypoint");
            let owner = &o["metadata"]["ownerReferences"][0];
            assert_eq!(
                (owner["kind"].as_str(), owner["uid"].as_str(), owner["controller"].as_bool()),
                (Some("Gateway"), Some("u-1"), Some(true))
            );
        }
        let d = &made[1];
        let pod = &d["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"]["istio.io/dataplane-mode"], "none", "no node proxy captures the waypoint");
        assert_eq!(pod["metadata"]["labels"][GATEWAY_NAME_LABEL], "waypoint");
        assert_eq!(d["spec"]["selector"]["matchLabels"][GATEWAY_NAME_LABEL], "waypoint");
        assert_eq!(pod["spec"]["serviceAccountName"], "waypoint", "its identity is the Gateway's account");
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert_eq!(pod["spec"]["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "restricted Pod Security");
        assert!(d["spec"].get("replicas").is_none(), "left to the API server's default and to autoscalers");
        let token = &pod["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"];
        assert_eq!((token["audience"].as_str(), token["path"].as_str()), (Some("istio-ca"), Some(TOKEN_FILE)));
        assert_eq!(env(d, "SLIPSTREAM_WAYPOINT_TOKEN_FILE")["value"], "/var/run/secrets/tokens/istio-token");
        assert_eq!(env(d, "SLIPSTREAM_WAYPOINT_CONTROL_PLANE")["value"], "istiod.istio-system.svc:15012");
        assert_eq!(env(d, "GATEWAY_NAME")["value"], "waypoint");
        assert_eq!(env(d, "INSTANCE_IP")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["image"], "registry.example/slipstream:1.0");
        assert_eq!(c["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], WAYPOINT_STATUS_PORT);
        let ports: Vec<(&str, i64)> = made[2]["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["port"].as_i64().unwrap()))
            .collect();
        assert_eq!(ports, [("status-port", 15021), ("mesh", 15008)]);
        assert_eq!(made[2]["spec"]["ports"][1]["appProtocol"], "hbone");
    }

    #[test]
    fn other_gateways_and_gateways_without_uid_make_nothing() {
        assert!(objects(&gateway("istio"), &settings()).is_none());
        let mut g = gateway("istio-waypoint");
        g["metadata"].as_object_mut().unwrap().remove("uid");
        assert!(objects(&g, &settings()).is_none());
    }
}
