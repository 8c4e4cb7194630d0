//! Objects in, resources out: translation tables and incremental behavior.

use super::*;
use crate::objects::ClusterObject;
use crate::resources::ResourceKey;
use crate::translate::parse_manifests;
use slipstream_core::policy::{Action, Scope};
use slipstream_core::WorkloadType;
use slipstream_core::{NetworkAddress, Port, Service, TunnelProtocol, Workload, WorkloadStatus};

fn settings() -> IndexSettings {
    IndexSettings { cluster_id: "c1".into(), ..Default::default() }
}

fn objects(y: &str) -> Vec<ClusterObject> {
    parse_manifests(y).unwrap_or_else(|e| panic!("{e:?}"))
}

fn one(y: &str) -> ClusterObject {
    let mut v = objects(y);
    assert_eq!(v.len(), 1);
    v.remove(0)
}

fn index(y: &str) -> Index {
    let mut ix = Index::new(settings());
    for o in objects(y) {
        ix.apply(ObjectEvent::Upsert(o)).unwrap();
    }
    ix
}

fn upsert(ix: &mut Index, y: &str) -> Changes {
    ix.apply(ObjectEvent::Upsert(one(y))).unwrap()
}

fn namespace(name: &str, labels: &str) -> String {
    format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n")
}

/// A ready pod of a Deployment (`app: <app>`), serving `http` on 8080.
fn pod(ns: &str, name: &str, app: &str, ip: &str, node: &str) -> String {
    pod_with(ns, name, &format!("app: {app}, pod-template-hash: 5d9f"), ip, node, true)
}

fn pod_with(ns: &str, name: &str, labels: &str, ip: &str, node: &str, ready: bool) -> String {
    let status = if ip.is_empty() {
        "{phase: Pending}".to_string()
    } else {
        format!(
            "{{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}], hostIP: 172.18.0.1, conditions: [{{type: Ready, status: '{}'}}]}}",
            if ready { "True" } else { "False" }
        )
    };
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{{labels}}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: {}-5d9f, uid: u1, controller: true}}]\nspec:\n  nodeName: {node}\n  serviceAccountName: web\n  containers: [{{name: c, ports: [{{name: http, containerPort: 8080}}]}}]\nstatus: {status}\n",
        name.rsplit_once('-').map(|(d, _)| d).unwrap_or(name)
    )
}

fn service(ns: &str, name: &str, selector: &str, vip: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  selector: {{{selector}}}\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n  ports: [{{name: web, port: 80, targetPort: http}}, {{name: admin, port: 9000}}]\n"
    )
}

fn policy(ns: &str, name: &str, spec: &str) -> String {
    format!("---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
}

fn peer_authn(ns: &str, name: &str, spec: &str) -> String {
    format!("---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
}

fn workload(ix: &Index, ns: &str, name: &str) -> Option<Workload> {
    ix.mesh_config().workloads.into_iter().find(|w| w.namespace == ns && w.name == name)
}

fn addr(uid: &str) -> ResourceKey {
    ResourceKey::new(TypeUrl::Address, uid)
}

fn names(keys: &[ResourceKey]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn workloads_and_services_from_objects() {
    let y = [
        namespace("demo", "istio.io/dataplane-mode: ambient"),
        service("demo", "web", "app: web", "10.96.0.10"),
        service("demo", "headless", "app: web", "None"),
        pod("demo", "web-abcde", "web", "10.244.1.2", "node1"),
        pod_with("demo", "solo", "app: solo, istio.io/dataplane-mode: none, version: v2", "10.244.2.2", "node2", false),
    ]
    .concat();
    let ix = index(&y);
    let cfg = ix.mesh_config();
    let web = Workload {
        uid: "c1//Pod/demo/web-abcde".into(),
        name: "web-abcde".into(),
        namespace: "demo".into(),
        addresses: vec!["10.244.1.2".parse().unwrap()],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: "web".into(),
        node: "node1".into(),
        canonical_name: "web".into(),
        canonical_revision: "latest".into(),
        workload_type: WorkloadType::Deployment,
        workload_name: "web".into(),
        services: [
            (
                "demo/headless.demo.svc.cluster.local".to_string(),
                vec![
                    Port { service_port: 80, target_port: 8080, app_protocol: Default::default() },
                    Port { service_port: 9000, target_port: 9000, app_protocol: Default::default() },
                ],
            ),
            (
                "demo/web.demo.svc.cluster.local".to_string(),
                vec![
                    Port { service_port: 80, target_port: 8080, app_protocol: Default::default() },
                    Port { service_port: 9000, target_port: 9000, app_protocol: Default::default() },
                ],
            ),
        ]
        .into(),
        status: WorkloadStatus::Healthy,
        cluster_id: "c1".into(),
        capacity: 1,
        ..Default::default()
    };
    assert_eq!(cfg.workloads[1], web);
    let solo = &cfg.workloads[0];
    assert_eq!((solo.name.as_str(), solo.tunnel_protocol, solo.status), ("solo", TunnelProtocol::None, WorkloadStatus::Unhealthy));
    assert_eq!((solo.canonical_name.as_str(), solo.canonical_revision.as_str()), ("solo", "v2"));
    assert!(solo.services.is_empty());
    assert_eq!(
        cfg.services,
        vec![
            Service {
                name: "headless".into(),
                namespace: "demo".into(),
                hostname: "headless.demo.svc.cluster.local".into(),
                addresses: vec![],
                ports: vec![
                    Port { service_port: 80, target_port: 0, app_protocol: Default::default() },
                    Port { service_port: 9000, target_port: 9000, app_protocol: Default::default() }
                ],
                subject_alt_names: vec![],
                waypoint: None,
            },
            Service {
                name: "web".into(),
                namespace: "demo".into(),
                hostname: "web.demo.svc.cluster.local".into(),
                addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
                ports: vec![
                    Port { service_port: 80, target_port: 0, app_protocol: Default::default() },
                    Port { service_port: 9000, target_port: 9000, app_protocol: Default::default() }
                ],
                subject_alt_names: vec![],
                waypoint: None,
            },
        ]
    );
    // What the CA needs, without decoding.
    let v = &ix.resources()[&addr("c1//Pod/demo/web-abcde")];
    assert_eq!(v.node.as_deref(), Some("node1"));
    assert_eq!(v.identity.as_deref(), Some("spiffe://cluster.local/ns/demo/sa/web"));
    assert_eq!(ix.resources().len(), 4);
}

#[test]
fn trust_domain_and_settings_shape_names() {
    let mut ix = Index::new(IndexSettings {
        cluster_id: "east".into(),
        trust_domain: "example.org".into(),
        domain_suffix: "corp.internal".into(),
        root_namespace: "mesh-root".into(),
        waypoint_template: None,
    });
    for o in objects(&[pod("demo", "web-a", "web", "10.244.1.2", "node1"), service("demo", "web", "app: web", "10.96.0.10")].concat()) {
        ix.apply(ObjectEvent::Upsert(o)).unwrap();
    }
    let v = &ix.resources()[&addr("east//Pod/demo/web-a")];
    assert_eq!(v.identity.as_deref(), Some("spiffe://example.org/ns/demo/sa/web"));
    let w = workload(&ix, "demo", "web-a").unwrap();
    assert_eq!((w.trust_domain.as_str(), w.cluster_id.as_str()), ("example.org", "east"));
    assert!(w.services.contains_key("demo/web.demo.svc.corp.internal"));
}

#[test]
fn pods_unscheduled_or_ended_have_no_workload_and_scheduled_ones_one_without_address() {
    let unscheduled = pod_with("demo", "p", "app: a", "", "node1", false).replace("  nodeName: node1\n", "");
    let mut ix = index(&unscheduled);
    assert!(ix.resources().is_empty(), "not scheduled: no workload");
    // Scheduled, no address yet: published without one (its node proxy
    // gives it the CNI's; the CA places its identity on node1).
    let c = upsert(&mut ix, &pod_with("demo", "p", "app: a", "", "node1", false));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/p"]);
    let w = workload(&ix, "demo", "p").unwrap();
    assert_eq!((w.addresses.len(), w.node.as_str(), w.service_account.as_str()), (0, "node1", "web"));
    let v = ix.resources().get(&addr("c1//Pod/demo/p")).cloned().unwrap();
    assert_eq!((v.node.as_deref(), v.identity.as_deref()), (Some("node1"), Some("spiffe://cluster.local/ns/demo/sa/web")));
    let c = upsert(&mut ix, &pod("demo", "p", "a", "10.244.1.9", "node1"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/p"]);
    assert_eq!(workload(&ix, "demo", "p").unwrap().addresses, vec!["10.244.1.9".parse::<std::net::IpAddr>().unwrap()]);
    let done = pod("demo", "p", "a", "10.244.1.9", "node1").replace("phase: Running", "phase: Succeeded");
    let c = upsert(&mut ix, &done);
    assert_eq!(names(&c.removed), ["Address c1//Pod/demo/p"]);
}

#[test]
fn one_pod_change_is_one_resource() {
    let mut y = [namespace("demo", "istio.io/dataplane-mode: ambient"), peer_authn("demo", "default", "{mtls: {mode: STRICT}}")].concat();
    for i in 0..20 {
        y += &service("demo", &format!("s{i}"), &format!("app: a{}", i % 5), &format!("10.96.0.{}", 10 + i));
        y += &policy("demo", &format!("p{i}"), &format!("{{selector: {{matchLabels: {{app: a{}}}}}, rules: [{{}}]}}", i % 5));
    }
    for i in 0..50 {
        y += &pod("demo", &format!("w{}-x{i}", i % 5), &format!("a{}", i % 5), &format!("10.244.1.{}", i + 2), "node1");
    }
    let mut ix = index(&y);
    let before = ix.resources().len();
    // Readiness flips: only that workload changes.
    let c = upsert(&mut ix, &pod_with("demo", "w3-x8", "app: a3, pod-template-hash: 5d9f", "10.244.1.10", "node1", false));
    assert_eq!((names(&c.upserted), c.removed.len()), (vec!["Address c1//Pod/demo/w3-x8".to_string()], 0));
    // The same object again: nothing.
    let c = upsert(&mut ix, &pod_with("demo", "w3-x8", "app: a3, pod-template-hash: 5d9f", "10.244.1.10", "node1", false));
    assert!(c.is_empty(), "{c:?}");
    // A new pod in a STRICT namespace: its workload and its converted policy.
    let c = upsert(&mut ix, &pod("demo", "w1-new", "a1", "10.244.1.200", "node1"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/w1-new", "Authorization demo/istio_converted_strict_w1-new"]);
    assert_eq!(ix.resources().len(), before + 2);
    let w = workload(&ix, "demo", "w1-new").unwrap();
    assert_eq!(w.services.len(), 4, "{:?}", w.services.keys());
    assert_eq!(w.authorization_policies.len(), 5, "{:?}", w.authorization_policies);
}

#[test]
fn service_selector_change_moves_members() {
    let y = [
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        pod("demo", "b-1", "b", "10.244.1.3", "node1"),
        pod("demo", "c-1", "c", "10.244.1.4", "node1"),
        pod("other", "a-2", "a", "10.244.1.5", "node1"),
        service("demo", "s", "app: a", "10.96.0.10"),
    ]
    .concat();
    let mut ix = index(&y);
    assert!(workload(&ix, "demo", "a-1").unwrap().services.contains_key("demo/s.demo.svc.cluster.local"));
    assert!(workload(&ix, "other", "a-2").unwrap().services.is_empty(), "services select in their namespace only");
    let c = upsert(&mut ix, &service("demo", "s", "app: b", "10.96.0.10"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1", "Address c1//Pod/demo/b-1"], "the service's bytes did not change");
    assert!(workload(&ix, "demo", "a-1").unwrap().services.is_empty());
    assert!(workload(&ix, "demo", "b-1").unwrap().services.contains_key("demo/s.demo.svc.cluster.local"));
    let c = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Service, "demo", "s"))).unwrap();
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/b-1"]);
    assert_eq!(names(&c.removed), ["Address demo/s.demo.svc.cluster.local"]);
}

#[test]
fn namespace_label_toggles_meshing() {
    let y = [
        namespace("demo", ""),
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        pod("demo", "b-1", "b", "10.244.1.3", "node1"),
        pod("other", "c-1", "c", "10.244.1.4", "node1"),
    ]
    .concat();
    let mut ix = index(&y);
    assert_eq!(workload(&ix, "demo", "a-1").unwrap().tunnel_protocol, TunnelProtocol::None);
    let c = upsert(&mut ix, &namespace("demo", "istio.io/dataplane-mode: ambient"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1", "Address c1//Pod/demo/b-1"]);
    assert_eq!(workload(&ix, "demo", "a-1").unwrap().tunnel_protocol, TunnelProtocol::Hbone);
    // Other labels: recomputed, but nothing to report.
    let c = upsert(&mut ix, &namespace("demo", "istio.io/dataplane-mode: ambient, team: x"));
    assert!(c.is_empty());
    let c = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Namespace, "", "demo"))).unwrap();
    assert_eq!(c.upserted.len(), 2);
    assert_eq!(workload(&ix, "demo", "b-1").unwrap().tunnel_protocol, TunnelProtocol::None);
}

#[test]
fn deleting_a_pod_removes_its_resources() {
    let y = [
        namespace("demo", "istio.io/dataplane-mode: ambient"),
        peer_authn("demo", "default", "{mtls: {mode: STRICT}}"),
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
    ]
    .concat();
    let mut ix = index(&y);
    let p = &ix.mesh_config().policies[0];
    assert_eq!((p.key().as_str(), p.scope, p.action), ("demo/istio_converted_strict_a-1", Scope::WorkloadSelector, Action::Deny));
    assert_eq!(workload(&ix, "demo", "a-1").unwrap().authorization_policies, ["demo/istio_converted_strict_a-1"]);
    let c = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Pod, "demo", "a-1"))).unwrap();
    assert_eq!(names(&c.removed), ["Address c1//Pod/demo/a-1", "Authorization demo/istio_converted_strict_a-1"]);
    assert!(c.upserted.is_empty());
    assert!(ix.resources().is_empty());
    // Deleting what is not there changes nothing.
    assert!(ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Pod, "demo", "a-1"))).unwrap().is_empty());
}

#[test]
fn invalid_objects_change_nothing() {
    let mut ix =
        index(&[namespace("demo", ""), pod("demo", "a-1", "a", "10.244.1.2", "node1"), policy("demo", "p", "{rules: [{}]}")].concat());
    let before = ix.resources().clone();
    // Objects that parse but do not validate (as a Kubernetes source would hand them over).
    let bad_pod = pod("demo", "a-1", "b", "10.244.1.2", "node1").replace("podIPs: [{ip: 10.244.1.2}]", "podIPs: [{ip: 10.244.1.999}]");
    let bad_policy = policy("demo", "p", "{action: CUSTOM, provider: {name: x}}");
    for y in [bad_pod, bad_policy] {
        let v = serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&y).unwrap()).unwrap();
        let o = crate::objects::parse_value(v).unwrap().unwrap();
        let e = ix.apply(ObjectEvent::Upsert(o)).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}: ", e.object())), "{e}");
        assert_eq!(*ix.resources(), before, "{e}");
    }
    // The previous version stays in force: a later unrelated change still sees it.
    upsert(&mut ix, &service("demo", "s", "app: a", "10.96.0.10"));
    assert!(workload(&ix, "demo", "a-1").unwrap().services.contains_key("demo/s.demo.svc.cluster.local"));
}

#[test]
fn authorization_policies_bind_to_selected_workloads() {
    let y = [
        namespace("demo", "istio.io/dataplane-mode: ambient"),
        namespace("other", "istio.io/dataplane-mode: ambient"),
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        pod("demo", "b-1", "b", "10.244.1.3", "node1"),
        pod("other", "a-2", "a", "10.244.1.4", "node1"),
        pod("plain", "a-3", "a", "10.244.1.5", "node1"),
        policy("demo", "ns-wide", "{action: DENY, rules: [{from: [{source: {namespaces: [evil]}}]}]}"),
        policy("demo", "for-a", "{selector: {matchLabels: {app: a}}, rules: [{}]}"),
        policy("demo", "audit", "{selector: {matchLabels: {app: a}}, action: AUDIT}"),
    ]
    .concat();
    let mut ix = index(&y);
    assert_eq!(workload(&ix, "demo", "a-1").unwrap().authorization_policies, ["demo/for-a"]);
    assert!(workload(&ix, "demo", "b-1").unwrap().authorization_policies.is_empty(), "namespace-wide policies are not listed");
    assert!(workload(&ix, "other", "a-2").unwrap().authorization_policies.is_empty());
    let keys: Vec<String> = ix.mesh_config().policies.iter().map(|p| p.key()).collect();
    assert_eq!(keys, ["demo/for-a", "demo/ns-wide"], "AUDIT sends nothing");
    // The root namespace's selector selects in every namespace (meshed workloads only).
    let c = upsert(&mut ix, &policy("istio-system", "all-a", "{selector: {matchLabels: {app: a}}, action: DENY, rules: [{}]}"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1", "Address c1//Pod/other/a-2", "Authorization istio-system/all-a"]);
    assert_eq!(workload(&ix, "other", "a-2").unwrap().authorization_policies, ["istio-system/all-a"]);
    assert!(workload(&ix, "plain", "a-3").unwrap().authorization_policies.is_empty());
    // A selector change moves the policy between workloads.
    let c = upsert(&mut ix, &policy("demo", "for-a", "{selector: {matchLabels: {app: b}}, rules: [{}]}"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1", "Address c1//Pod/demo/b-1"], "the policy itself is the same");
    assert_eq!(workload(&ix, "demo", "b-1").unwrap().authorization_policies, ["demo/for-a"]);
    let c = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::AuthorizationPolicy, "demo", "for-a"))).unwrap();
    assert_eq!(names(&c.removed), ["Authorization demo/for-a"]);
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/b-1"]);
}

#[test]
fn mesh_wide_peer_authentication_reaches_every_namespace() {
    let y = [
        namespace("demo", "istio.io/dataplane-mode: ambient"),
        namespace("other", "istio.io/dataplane-mode: ambient"),
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        pod("other", "b-1", "b", "10.244.1.3", "node1"),
        pod("plain", "c-1", "c", "10.244.1.4", "node1"),
    ]
    .concat();
    let mut ix = index(&y);
    let c = upsert(&mut ix, &peer_authn("istio-system", "default", "{mtls: {mode: STRICT}}"));
    assert_eq!(
        names(&c.upserted),
        [
            "Address c1//Pod/demo/a-1",
            "Address c1//Pod/other/b-1",
            "Authorization demo/istio_converted_strict_a-1",
            "Authorization other/istio_converted_strict_b-1"
        ]
    );
    // A namespace's PERMISSIVE overrides it there.
    let c = upsert(&mut ix, &peer_authn("other", "default", "{mtls: {mode: PERMISSIVE}}"));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/other/b-1"]);
    assert_eq!(names(&c.removed), ["Authorization other/istio_converted_strict_b-1"]);
    // A workload's port-level exception.
    let c = upsert(&mut ix, &peer_authn("demo", "a", "{selector: {matchLabels: {app: a}}, portLevelMtls: {9000: {mode: PERMISSIVE}}}"));
    assert_eq!(names(&c.upserted), ["Authorization demo/istio_converted_strict_a-1"]);
    let p = ix.mesh_config().policies.into_iter().find(|p| p.name == "istio_converted_strict_a-1").unwrap();
    assert_eq!(p.rules[0].clauses[0].matches[0].not_destination_ports, vec![9000]);
}

#[test]
fn services_without_selector_take_members_from_endpoint_slices() {
    let y = [
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        pod("demo", "b-1", "b", "10.244.1.3", "node1"),
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: demo}\nspec: {clusterIP: 10.96.0.20, ports: [{name: web, port: 80, targetPort: 8080}]}\n".into(),
    ]
    .concat();
    let mut ix = index(&y);
    assert!(workload(&ix, "demo", "a-1").unwrap().services.is_empty());
    let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ext-1, namespace: demo, labels: {kubernetes.io/service-name: ext}}\naddressType: IPv4\nports: [{name: web, port: 8081}]\nendpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3], targetRef: {kind: Pod, name: b-1}}]\n";
    let c = upsert(&mut ix, slice);
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1", "Address c1//Pod/demo/b-1"]);
    assert_eq!(
        workload(&ix, "demo", "a-1").unwrap().services["demo/ext.demo.svc.cluster.local"],
        vec![Port { service_port: 80, target_port: 8081, app_protocol: Default::default() }]
    );
    let c = upsert(&mut ix, &slice.replace(", {addresses: [10.244.1.3], targetRef: {kind: Pod, name: b-1}}", ""));
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/b-1"]);
    let c = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::EndpointSlice, "demo", "ext-1"))).unwrap();
    assert_eq!(names(&c.upserted), ["Address c1//Pod/demo/a-1"]);
}

#[test]
fn objects_may_come_in_any_order() {
    // Pods before their namespace and services, as a watch may deliver them.
    let parts = [
        pod("demo", "a-1", "a", "10.244.1.2", "node1"),
        service("demo", "s", "app: a", "10.96.0.10"),
        namespace("demo", "istio.io/dataplane-mode: ambient"),
    ];
    let forward = index(&parts.concat());
    let backward = index(&parts.iter().rev().cloned().collect::<Vec<_>>().concat());
    assert_eq!(forward.resources(), backward.resources());
    assert_eq!(workload(&forward, "demo", "a-1").unwrap().tunnel_protocol, TunnelProtocol::Hbone);
}

/// Not a benchmark (that is `slipstream bench`'s job): a look at the cost
/// at the issue's scale. Run with
/// `cargo test --release -p slipstream-control scale -- --ignored --nocapture`.
#[test]
#[ignore]
fn scale_10k_pods_1k_services_1k_policies() {
    use std::time::Instant;
    let mut events = Vec::new();
    let nss = 50;
    for n in 0..nss {
        events.push(one(&namespace(&format!("ns{n}"), "istio.io/dataplane-mode: ambient")));
    }
    for s in 0..1000 {
        events.push(one(&service(
            &format!("ns{}", s % nss),
            &format!("s{s}"),
            &format!("app: a{s}"),
            &format!("10.96.{}.{}", s / 250, s % 250 + 2),
        )));
        events.push(one(&policy(
            &format!("ns{}", s % nss),
            &format!("p{s}"),
            &format!("{{selector: {{matchLabels: {{app: a{s}}}}}, rules: [{{from: [{{source: {{namespaces: [x]}}}}]}}]}}"),
        )));
    }
    for p in 0..10_000 {
        let s = p % 1000;
        events.push(one(&pod(
            &format!("ns{}", s % nss),
            &format!("w{s}-{p}"),
            &format!("a{s}"),
            &format!("10.{}.{}.{}", 1 + p / 65536, (p / 256) % 256, p % 256),
            "node1",
        )));
    }
    let mut ix = Index::new(settings());
    let t = Instant::now();
    for e in events {
        ix.apply(ObjectEvent::Upsert(e)).unwrap();
    }
    println!("initial: {} resources in {:?}", ix.resources().len(), t.elapsed());
    let mut times = Vec::new();
    for i in 0..100 {
        let p = i * 97;
        let s = p % 1000;
        let o = one(&pod_with(
            &format!("ns{}", s % nss),
            &format!("w{s}-{p}"),
            &format!("app: a{s}, pod-template-hash: 5d9f"),
            &format!("10.{}.{}.{}", 1 + p / 65536, (p / 256) % 256, p % 256),
            "node1",
            false,
        ));
        let t = Instant::now();
        let c = ix.apply(ObjectEvent::Upsert(o)).unwrap();
        times.push(t.elapsed());
        assert_eq!(c.upserted.len(), 1);
    }
    times.sort();
    println!("pod change: p50 {:?} p99 {:?}", times[50], times[98]);
    let t = Instant::now();
    let c = ix.apply(ObjectEvent::Upsert(one(&service("ns3", "s3", "app: a53", "10.96.0.5")))).unwrap();
    println!("service selector change: {} changes in {:?}", c.upserted.len(), t.elapsed());
    let t = Instant::now();
    let c = ix.apply(ObjectEvent::Upsert(one(&peer_authn("istio-system", "default", "{mtls: {mode: STRICT}}")))).unwrap();
    println!("mesh-wide STRICT: {} changes in {:?}", c.upserted.len(), t.elapsed());
}

fn gateway(ns: &str, name: &str, labels: &str, port: u16) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}\nspec:\n  gatewayClassName: istio-waypoint\n  listeners: [{{name: mesh, port: {port}, protocol: HBONE}}]\n"
    )
}

fn service_waypoint(ix: &Index, ns: &str, name: &str) -> Option<String> {
    let cfg = ix.mesh_config();
    let s = cfg.services.iter().find(|s| s.namespace == ns && s.name == name).expect("service");
    s.waypoint.as_ref().map(|g| format!("{}/{}", g.namespace, g.hostname))
}

#[test]
fn waypoint_labels_fill_the_waypoint_fields_and_fail_closed() {
    let mut ix = index(&format!(
        "{}{}{}{}",
        namespace("bookinfo", "istio.io/dataplane-mode: ambient"),
        service("bookinfo", "reviews", "app: reviews", "10.96.0.10"),
        service("bookinfo", "ratings", "app: ratings", "10.96.0.11"),
        pod("bookinfo", "reviews-v1-5d9f-a", "reviews", "10.244.1.10", "node1"),
    ));
    assert_eq!(service_waypoint(&ix, "bookinfo", "reviews"), None);
    // The namespace asks for a waypoint that does not exist yet: the field
    // names it anyway (the node proxy refuses the traffic; Istio would
    // leave it empty and let traffic skip the waypoint).
    upsert(&mut ix, &namespace("bookinfo", "istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint"));
    let host = Some("bookinfo/waypoint.bookinfo.svc.cluster.local".to_string());
    assert_eq!(service_waypoint(&ix, "bookinfo", "reviews"), host);
    // A waypoint for services: pods inherit nothing from the namespace.
    let port = |ix: &Index| {
        ix.mesh_config().services.iter().find(|s| s.name == "reviews").and_then(|s| s.waypoint.as_ref()).map(|g| g.hbone_mtls_port)
    };
    assert_eq!(port(&ix), Some(0), "named, with no port while the waypoint does not exist");
    let changes = upsert(&mut ix, &gateway("bookinfo", "waypoint", "", 15008));
    assert_eq!(
        names(&changes.upserted),
        vec!["Address bookinfo/ratings.bookinfo.svc.cluster.local", "Address bookinfo/reviews.bookinfo.svc.cluster.local"],
        "the namespace's services: the binding holds now"
    );
    assert_eq!(port(&ix), Some(15008));
    assert_eq!(workload(&ix, "bookinfo", "reviews-v1-5d9f-a").unwrap().waypoint, None);
    // A service opts out; another names its own waypoint.
    upsert(
        &mut ix,
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: ratings, namespace: bookinfo, labels: {istio.io/use-waypoint: none}}\nspec:\n  selector: {app: ratings}\n  clusterIP: 10.96.0.11\n  ports: [{port: 9080}]\n",
    );
    assert_eq!(service_waypoint(&ix, "bookinfo", "ratings"), None);
    // A waypoint for workloads too: the pod gets it.
    upsert(&mut ix, &gateway("bookinfo", "waypoint", "istio.io/waypoint-for: all", 15008));
    let w = workload(&ix, "bookinfo", "reviews-v1-5d9f-a").unwrap();
    assert_eq!(w.waypoint.map(|g| g.hostname), Some("waypoint.bookinfo.svc.cluster.local".to_string()));
    // The waypoint's own pods and service never get one.
    upsert(
        &mut ix,
        &pod_with("bookinfo", "waypoint-5d9f-a", "gateway.networking.k8s.io/gateway-name: waypoint", "10.244.1.20", "node1", true),
    );
    assert_eq!(workload(&ix, "bookinfo", "waypoint-5d9f-a").unwrap().waypoint, None);
    // An invalid waypoint is refused naming the field, and changes nothing.
    let e = parse_manifests(&gateway("bookinfo", "bad", "", 80)).unwrap_err();
    assert_eq!(e[0].field, "spec.listeners[0].port");
    let e = parse_manifests(&gateway("bookinfo", "bad", "istio.io/waypoint-for: pods", 15008)).unwrap_err();
    assert_eq!(e[0].field, "metadata.labels[istio.io/waypoint-for]");
    assert_eq!(service_waypoint(&ix, "bookinfo", "reviews"), host);
    // Deleting the Gateway keeps the field (fail closed), and the pod,
    // bound only through the waypoint's `all`, loses it.
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Gateway, "bookinfo", "waypoint"))).unwrap();
    assert_eq!(service_waypoint(&ix, "bookinfo", "reviews"), host);
    assert_eq!(port(&ix), Some(0));
    assert_eq!(workload(&ix, "bookinfo", "reviews-v1-5d9f-a").unwrap().waypoint, None);
}

#[test]
fn http_routes_become_route_resources_of_their_parent_services() {
    let mut ix = index(&format!(
        "{}{}{}",
        service("bookinfo", "reviews", "app: reviews", "10.96.0.10"),
        service("bookinfo", "reviews-v1", "app: reviews, version: v1", "10.96.0.11"),
        service("bookinfo", "reviews-v2", "app: reviews, version: v2", "10.96.0.12"),
    ));
    let route = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  parentRefs: [{group: '', kind: Service, name: reviews, port: 9080}]\n  rules:\n  - backendRefs: [{name: reviews-v1, port: 9080, weight: 90}, {name: reviews-v2, port: 9080, weight: 10}]\n";
    let changes = upsert(&mut ix, route);
    let key = ResourceKey::new(TypeUrl::Route, "bookinfo/reviews.bookinfo.svc.cluster.local");
    assert_eq!(changes.upserted, vec![key.clone()]);
    let r = slipstream_api::routes::routes_from_any(&ix.resources().get(&key).unwrap().body).unwrap();
    assert_eq!(r.service, "bookinfo/reviews.bookinfo.svc.cluster.local");
    assert_eq!(r.rules.len(), 1);
    let weights: Vec<(String, u32)> = r.rules[0].backends.iter().map(|b| (b.service.clone(), b.weight)).collect();
    assert_eq!(
        weights,
        vec![
            ("bookinfo/reviews-v1.bookinfo.svc.cluster.local".to_string(), 90),
            ("bookinfo/reviews-v2.bookinfo.svc.cluster.local".to_string(), 10)
        ]
    );
    assert_eq!(r.rules[0].port, 9080);
    // The service goes: so do its routes; it comes back: they return.
    let changes = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Service, "bookinfo", "reviews"))).unwrap();
    assert!(changes.removed.contains(&key), "{:?}", names(&changes.removed));
    let changes = upsert(&mut ix, &service("bookinfo", "reviews", "app: reviews", "10.96.0.10"));
    assert!(changes.upserted.contains(&key));
    // The route goes.
    let changes = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::HTTPRoute, "bookinfo", "reviews"))).unwrap();
    assert_eq!(changes.removed, vec![key]);
    // An invalid route is refused, naming the field.
    let bad = route.replace("backendRefs: [", "matches: [{path: {type: RegularExpression, value: '.*'}}]\n    backendRefs: [");
    let e = parse_manifests(&bad).unwrap_err();
    assert_eq!(e[0].field, "spec.rules[0].matches[0].path.type", "{e:?}");
}

/// `--domain-suffix`: every name the index makes, and every full name it
/// reads, is in the cluster's own domain.
#[test]
fn a_cluster_domain_other_than_cluster_local_is_used_throughout() {
    let mut ix = Index::new(IndexSettings { cluster_id: "c1".into(), domain_suffix: "corp.example".into(), ..Default::default() });
    for o in objects(&format!(
        "{}{}{}{}{}",
        namespace("bookinfo", "istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint"),
        gateway("bookinfo", "waypoint", "", 15008),
        service("bookinfo", "reviews", "app: reviews", "10.96.0.10"),
        service("bookinfo", "reviews-v1", "app: reviews, version: v1", "10.96.0.11"),
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  parentRefs: [{group: '', kind: Service, name: reviews, port: 9080}]\n  rules:\n  - backendRefs: [{name: reviews-v1, port: 9080}]\n",
    )) {
        ix.apply(ObjectEvent::Upsert(o)).unwrap();
    }
    let svc = ix.mesh_config().services.into_iter().find(|s| s.name == "reviews").unwrap();
    assert_eq!(svc.hostname, "reviews.bookinfo.svc.corp.example");
    assert_eq!(svc.waypoint.as_ref().map(|g| g.hostname.as_str()), Some("waypoint.bookinfo.svc.corp.example"));
    let key = ResourceKey::new(TypeUrl::Route, "bookinfo/reviews.bookinfo.svc.corp.example");
    let r = slipstream_api::routes::routes_from_any(&ix.resources().get(&key).expect("the route resource").body).unwrap();
    assert_eq!(r.rules[0].backends[0].service, "bookinfo/reviews-v1.bookinfo.svc.corp.example");
    // A VirtualService may name its host in full, in this domain only
    // (as the Kubernetes source hands it over: parsed, validated by the
    // index with its settings).
    let vs = |host: &str| {
        let doc: serde_json::Value = serde_yaml::from_str(&format!("---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: bookinfo}}\nspec:\n  hosts: [{host}]\n  http:\n  - route: [{{destination: {{host: reviews-v1}}}}]\n"))
        .unwrap();
        crate::objects::parse_value(doc).unwrap().unwrap()
    };
    ix.apply(ObjectEvent::Upsert(vs("reviews.bookinfo.svc.corp.example"))).unwrap();
    let e = ix.apply(ObjectEvent::Upsert(vs("reviews.bookinfo.svc.cluster.local"))).unwrap_err();
    assert!(e.to_string().contains("spec.hosts[0]"), "{e}");
}

#[test]
fn virtual_services_and_destination_rules_become_routes_with_subsets_resolved() {
    let mut ix = index(&format!(
        "{}{}{}{}",
        service("bookinfo", "reviews", "app: reviews", "10.96.0.10"),
        pod_with("bookinfo", "reviews-v1-a", "app: reviews, version: v1", "10.244.1.2", "node1", true),
        pod_with("bookinfo", "reviews-v2-a", "app: reviews, version: v2", "10.244.1.3", "node1", true),
        pod_with("bookinfo", "reviews-v3-a", "app: reviews, version: v3", "10.244.1.4", "node1", true),
    ));
    let key = ResourceKey::new(TypeUrl::Route, "bookinfo/reviews.bookinfo.svc.cluster.local");
    let routes = |ix: &Index| ix.resources().get(&key).map(|v| slipstream_api::routes::routes_from_any(&v.body).unwrap());
    let vs = "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{headers: {end-user: {exact: jason}}}]\n    route: [{destination: {host: reviews, subset: v3}}]\n  - route: [{destination: {host: reviews, subset: v1}, weight: 90}, {destination: {host: reviews, subset: v2}, weight: 10}]\n";
    let changes = upsert(&mut ix, vs);
    assert_eq!(changes.upserted, vec![key.clone()]);
    let r = routes(&ix).unwrap();
    assert_eq!(r.source, "VirtualService");
    assert_eq!(r.rules.len(), 2);
    // No DestinationRule yet: the subsets select nothing.
    assert!(r.rules[0].backends[0].subset.as_ref().unwrap().workloads.is_empty());
    let dr = "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  host: reviews\n  trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}\n  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v2, labels: {version: v2}}\n  - {name: v3, labels: {version: v3}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}\n";
    let changes = upsert(&mut ix, dr);
    assert_eq!(changes.upserted, vec![key.clone()]);
    let r = routes(&ix).unwrap();
    let v3 = r.rules[0].backends[0].subset.clone().unwrap();
    assert_eq!(v3.workloads, ["c1//Pod/bookinfo/reviews-v3-a"]);
    assert_eq!(v3.traffic.unwrap().lb, slipstream_core::route::traffic::LoadBalancer::Random);
    assert_eq!(r.traffic.lb, slipstream_core::route::traffic::LoadBalancer::RoundRobin);
    let v1 = r.rules[1].backends[0].subset.clone().unwrap();
    assert_eq!((v1.workloads.as_slice(), r.rules[1].backends[0].weight), (["c1//Pod/bookinfo/reviews-v1-a".to_string()].as_slice(), 90));
    // A new v3 pod joins the subset; relabelled, it leaves it.
    upsert(&mut ix, &pod_with("bookinfo", "reviews-v3-b", "app: reviews, version: v3", "10.244.1.5", "node1", true));
    let v3 = routes(&ix).unwrap().rules[0].backends[0].subset.clone().unwrap();
    assert_eq!(v3.workloads, ["c1//Pod/bookinfo/reviews-v3-a", "c1//Pod/bookinfo/reviews-v3-b"]);
    upsert(&mut ix, &pod_with("bookinfo", "reviews-v3-b", "app: reviews, version: v2", "10.244.1.5", "node1", true));
    let v3 = routes(&ix).unwrap().rules[0].backends[0].subset.clone().unwrap();
    assert_eq!(v3.workloads, ["c1//Pod/bookinfo/reviews-v3-a"]);
    // A rate limit on one of the VirtualService's routes, then on the service.
    let limit = "---\napiVersion: slipstream.io/v1alpha1\nkind: LocalRateLimitPolicy\nmetadata: {name: jason, namespace: bookinfo}\nspec:\n  targetRefs: [{group: networking.istio.io, kind: VirtualService, name: reviews, sectionName: '0'}]\n  limit: {requests: 5, interval: 1m}\n";
    upsert(&mut ix, limit);
    let l = routes(&ix).unwrap().limits;
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].policy.as_str(), l[0].requests, l[0].burst), ("bookinfo/jason", 5, 5));
    assert!(l[0].applies(Some("bookinfo/reviews.0")) && !l[0].applies(Some("bookinfo/reviews.1")) && !l[0].applies(None));
    upsert(
        &mut ix,
        &limit.replace(
            "{group: networking.istio.io, kind: VirtualService, name: reviews, sectionName: '0'}",
            "{kind: Service, name: reviews}",
        ),
    );
    assert!(routes(&ix).unwrap().limits[0].applies(None), "the whole service");
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::LocalRateLimitPolicy, "bookinfo", "jason"))).unwrap();
    assert!(routes(&ix).unwrap().limits.is_empty());
    // An HTTPRoute for the same service takes precedence.
    let route = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  parentRefs: [{group: '', kind: Service, name: reviews}]\n  rules:\n  - backendRefs: [{name: reviews, port: 9080}]\n";
    upsert(&mut ix, route);
    assert_eq!(routes(&ix).unwrap().source, "HTTPRoute");
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::HTTPRoute, "bookinfo", "reviews"))).unwrap();
    assert_eq!(routes(&ix).unwrap().source, "VirtualService");
    // The VirtualService goes: the DestinationRule's policy alone still makes a resource.
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::VirtualService, "bookinfo", "reviews"))).unwrap();
    let r = routes(&ix).unwrap();
    assert!(r.rules.is_empty());
    assert_eq!(r.traffic.lb, slipstream_core::route::traffic::LoadBalancer::RoundRobin);
    let changes = ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::DestinationRule, "bookinfo", "reviews"))).unwrap();
    assert_eq!(changes.removed, vec![key]);
    // Invalid ones are refused naming the field.
    let e = parse_manifests(&vs.replace("subset: v3}", "subset: v3}, weight: -5")).unwrap_err();
    assert_eq!(e[0].field, "spec.http[0].route[0].weight", "{e:?}");
}

#[test]
fn a_selector_policy_with_l7_rules_moves_to_the_waypoint_in_front_of_its_pods() {
    use slipstream_core::policy::{Action, StringMatch};
    let mut ix = index(&format!(
        "{}{}{}",
        namespace("production", "istio.io/dataplane-mode: ambient"),
        pod_with("production", "billing-1", "app: billing", "10.244.2.2", "node2", true),
        service("production", "billing", "app: billing", "10.96.0.20"),
    ));
    let policy_yaml = policy(
        "production",
        "invoices",
        "{selector: {matchLabels: {app: billing}}, rules: [{from: [{source: {principals: [cluster.local/ns/production/sa/frontend]}}], to: [{operation: {methods: [GET]}}]}, {from: [{source: {namespaces: [ops]}}]}]}",
    );
    upsert(&mut ix, &policy_yaml);
    let authz = |ix: &Index| ix.mesh_config().policies.into_iter().find(|p| p.name == "invoices").unwrap();
    let routes = |ix: &Index| {
        let key = ResourceKey::new(TypeUrl::Route, "production/billing.production.svc.cluster.local");
        ix.resources().get(&key).map(|v| slipstream_api::routes::routes_from_any(&v.body).unwrap())
    };
    // No waypoint: the L4 fail-safe (the rule that needs L7 matches nothing).
    assert_eq!(authz(&ix).rules[0], slipstream_core::policy::Rule::never());
    assert!(routes(&ix).is_none());
    // A waypoint in front of billing's service: the node proxies keep the
    // policy as written (its L7 rule fail-safe) and let the waypoint
    // through with a rule of its own (the waypoint decides with the
    // original client); the waypoint gets the whole policy, for billing's
    // pod.
    upsert(&mut ix, &gateway("production", "waypoint", "", 15008));
    upsert(
        &mut ix,
        &service("production", "billing", "app: billing", "10.96.0.20").replace(
            "metadata: {name: billing, namespace: production}",
            "metadata: {name: billing, namespace: production, labels: {istio.io/use-waypoint: waypoint}}",
        ),
    );
    let a = authz(&ix);
    assert_eq!(a.rules[0], slipstream_core::policy::Rule::never(), "what bypasses the waypoint meets the fail-safe");
    assert_eq!(a.rules[1].clauses[0].matches[0].namespaces, [StringMatch::Exact("ops".into())], "an L4 rule is unchanged");
    assert_eq!(a.rules[2].clauses[0].matches[0].principals, [StringMatch::Exact("cluster.local/ns/production/sa/waypoint".into())]);
    let r = routes(&ix).expect("billing's routes resource");
    assert_eq!(r.policies.len(), 1);
    assert_eq!(r.policies[0].workloads.as_deref(), Some(&["c1//Pod/production/billing-1".to_string()][..]));
    assert_eq!(r.policies[0].rules.len(), 2);
    // A DENY with an L7 rule: at the node proxies it no longer applies to the waypoint.
    upsert(&mut ix, &policy_yaml.replace("rules:", "action: DENY, rules:"));
    let a = authz(&ix);
    assert_eq!(a.action, Action::Deny);
    let last = a.rules[0].clauses.last().unwrap();
    assert_eq!(last.matches[0].not_principals, [StringMatch::Exact("cluster.local/ns/production/sa/waypoint".into())]);
    // The binding goes: the waypoint gets no L7 version any more (it
    // decides by the node proxies' engine, with the L4 fail-safe); the
    // Gateway goes: nothing lets it through.
    upsert(&mut ix, &service("production", "billing", "app: billing", "10.96.0.20"));
    upsert(&mut ix, &policy_yaml);
    assert_eq!(authz(&ix).rules[0], slipstream_core::policy::Rule::never());
    assert!(routes(&ix).is_none_or(|r| r.policies.is_empty()));
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Gateway, "production", "waypoint"))).unwrap();
    assert_eq!(authz(&ix).rules.len(), 2, "the policy as written");
}

#[test]
fn a_root_policy_the_waypoint_cannot_decide_keeps_every_namespaces_policies_at_the_node_proxies() {
    let mut ix = index(&format!(
        "{}{}{}{}{}{}",
        namespace("production", "istio.io/dataplane-mode: ambient"),
        namespace("other", "istio.io/dataplane-mode: ambient"),
        gateway("production", "waypoint", "", 15008),
        pod_with("production", "billing-1", "app: billing", "10.244.2.2", "node2", true),
        service("production", "billing", "app: billing", "10.96.0.20").replace(
            "metadata: {name: billing, namespace: production}",
            "metadata: {name: billing, namespace: production, labels: {istio.io/use-waypoint: waypoint}}",
        ),
        policy("production", "invoices", "{selector: {matchLabels: {app: billing}}, rules: [{to: [{operation: {methods: [GET]}}]}]}"),
    ));
    let billing_routes = |ix: &Index| {
        let key = ResourceKey::new(TypeUrl::Route, "production/billing.production.svc.cluster.local");
        ix.resources().get(&key).map(|v| slipstream_api::routes::routes_from_any(&v.body).unwrap().policies).unwrap_or_default()
    };
    assert_eq!(billing_routes(&ix).len(), 1, "decided at the waypoint, at L7");
    // A mesh-wide policy (root namespace) with an attribute no waypoint
    // can evaluate, selecting no pod of production: production's policies
    // must all go back to the node proxies, though none of its pods or
    // services changed.
    let root = policy(
        "istio-system",
        "by-address",
        "{selector: {matchLabels: {app: elsewhere}}, rules: [{when: [{key: destination.ip, values: [10.0.0.1]}]}]}",
    );
    upsert(&mut ix, &root);
    assert!(billing_routes(&ix).is_empty(), "no partial set: the waypoint decides them all with the node proxies' engine");
}

#[test]
fn requests_addressed_to_a_pod_meet_the_gateways_its_services_and_its_own_policies_at_the_waypoint() {
    use slipstream_core::policy::StringMatch;
    let mut ix = index(&format!(
        "{}{}{}{}{}{}{}",
        namespace("production", "istio.io/dataplane-mode: ambient"),
        gateway("production", "waypoint", "istio.io/waypoint-for: workload", 15008),
        pod_with("production", "billing-1", "app: billing, istio.io/use-waypoint: waypoint", "10.244.2.2", "node2", true),
        pod_with("production", "other-1", "app: other", "10.244.2.3", "node2", true),
        service("production", "billing", "app: billing", "10.96.0.20"),
        policy("production", "invoices", "{selector: {matchLabels: {app: billing}}, rules: [{to: [{operation: {methods: [GET]}}]}]}",),
        policy("production", "no-admin", "{targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}], action: DENY, rules: [{to: [{operation: {paths: [/admin]}}]}]}"),
    ));
    assert!(workload(&ix, "production", "billing-1").unwrap().waypoint.is_some(), "bound for workload traffic");
    let own = |ix: &Index| {
        let key = ResourceKey::new(TypeUrl::Route, "production/waypoint.production.svc.cluster.local");
        ix.resources().get(&key).map(|v| slipstream_api::routes::routes_from_any(&v.body).unwrap()).expect("the waypoint's own routes")
    };
    let r = own(&ix);
    type Placed<'a> = (&'a str, Option<&'a [String]>, Option<&'a [String]>);
    let names: Vec<Placed> = r.policies.iter().map(|p| (p.name.as_str(), p.workloads.as_deref(), p.pods.as_deref())).collect();
    let billing = ["c1//Pod/production/billing-1".to_string()];
    assert_eq!(
        names,
        [("no-admin", None, None), ("invoices", Some(&billing[..]), None)],
        "the Gateway's policy for every pod-addressed request, billing's own policy at its endpoint"
    );
    // The node proxies let the waypoint through: it decides the policy,
    // with the original client.
    let a = ix.mesh_config().policies.into_iter().find(|p| p.name == "invoices").unwrap();
    assert_eq!(a.rules[1].clauses[0].matches[0].principals, [StringMatch::Exact("cluster.local/ns/production/sa/waypoint".into())]);
    // A policy of a Service bound to the waypoint: also for the requests
    // addressed to its pods bound to the waypoint (stricter than Istio).
    upsert(
        &mut ix,
        &service("production", "billing", "app: billing", "10.96.0.20").replace(
            "metadata: {name: billing, namespace: production}",
            "metadata: {name: billing, namespace: production, labels: {istio.io/use-waypoint: waypoint}}",
        ),
    );
    upsert(&mut ix, &gateway("production", "waypoint", "istio.io/waypoint-for: all", 15008));
    upsert(
        &mut ix,
        &policy(
            "production",
            "billing-get",
            "{targetRefs: [{kind: Service, name: billing}], rules: [{to: [{operation: {methods: [GET]}}]}]}",
        ),
    );
    let r = own(&ix);
    let p = r.policies.iter().find(|p| p.name == "billing-get").expect("billing's Service policy in the waypoint's own routes");
    assert_eq!((p.workloads.as_deref(), p.pods.as_deref()), (None, Some(&billing[..])), "for billing's pod only");
    // The Gateway goes: so do its routes.
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::Gateway, "production", "waypoint"))).unwrap();
    assert!(ix.resources().get(&ResourceKey::new(TypeUrl::Route, "production/waypoint.production.svc.cluster.local")).is_none());
}

#[test]
fn a_pod_that_copies_a_waypoints_labels_owner_and_account_but_runs_anything_else_is_no_waypoint() {
    use crate::gateway::render::{pod_template, DeploySettings};
    use serde_json::json;
    let deploy = DeploySettings {
        image: "registry.example/slipstream:1".into(),
        control_plane: "istiod.istio-system.svc:15012".into(),
        control_plane_san: "istiod.istio-system.svc".into(),
        root_pem: "ROOT".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "c1".into(),
        audience: "istio-ca".into(),
    };
    let mut ix = Index::new(IndexSettings { waypoint_template: Some(deploy.clone()), ..settings() });
    for o in objects(&format!(
        "{}{}{}",
        namespace("shop", "istio.io/dataplane-mode: ambient"),
        gateway("shop", "waypoint", "", 15008),
        service("shop", "waypoint", "gateway.networking.k8s.io/gateway-name: waypoint", "10.96.0.9"),
    )) {
        ix.apply(ObjectEvent::Upsert(o)).unwrap();
    }
    // The ReplicaSet's pod: the template's labels and spec, with what the
    // API server and scheduler add.
    let template = pod_template("waypoint", &deploy);
    let pod = |name: &str, ip: &str, spec: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "shop", "labels": template["metadata"]["labels"],
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "waypoint-7d9f", "uid": "rs-uid", "controller": true}]},
               "spec": spec,
               "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": "True"}]}})
    };
    let mut genuine = template["spec"].clone();
    genuine["nodeName"] = json!("node1");
    genuine["restartPolicy"] = json!("Always");
    genuine["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    let mut forged = genuine.clone();
    forged["containers"][0]["command"] = json!(["sh", "-c", "cat /var/run/secrets/tokens/istio-token"]);
    for o in [pod("waypoint-7d9f-a", "10.244.1.20", genuine), pod("waypoint-7d9f-x", "10.244.1.21", forged)] {
        ix.apply(ObjectEvent::Upsert(crate::objects::parse_value(o).unwrap().unwrap())).unwrap();
    }
    assert_eq!(
        ix.waypoint_pods(),
        [("shop".to_string(), "waypoint-7d9f-a".to_string(), "waypoint".to_string())].into(),
        "only the pod that runs the template may obtain the waypoint's identity and configuration"
    );
    let key = "shop/waypoint.shop.svc.cluster.local";
    assert!(workload(&ix, "shop", "waypoint-7d9f-a").unwrap().services.contains_key(key), "a replica of the waypoint");
    assert!(!workload(&ix, "shop", "waypoint-7d9f-x").unwrap().services.contains_key(key), "never a waypoint replica");
    // Without a template (the local cluster, whose agent refuses the
    // labels in what users apply) the label and account decide.
    let mut local = Index::new(settings());
    for o in objects(&format!(
        "{}{}",
        gateway("shop", "waypoint", "", 15008),
        pod_with("shop", "waypoint-5d9f-a", "gateway.networking.k8s.io/gateway-name: waypoint", "10.244.1.20", "node1", true),
    )) {
        local.apply(ObjectEvent::Upsert(o)).unwrap();
    }
    assert!(local.waypoint_pods().is_empty(), "runs as account web, not the waypoint's");
}

fn request_authn(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    )
}

/// RequestAuthentications reach the routes of the Services they name and
/// of every Service bound to the waypoint Gateway they name; a jwksUri's
/// keys are empty (every token refused) until the control plane fetched
/// them; a selector-bound one reaches nothing.
#[test]
fn request_authentications_reach_the_routes_of_what_they_target_with_fetched_keys() {
    use crate::translate::request_authentication::Fetch;
    const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"k","n":"AQAB","e":"AQAB"}]}"#;
    let mut ix = index(&format!(
        "{}{}{}{}",
        namespace("bookinfo", "istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint"),
        gateway("bookinfo", "waypoint", "", 15008),
        service("bookinfo", "reviews", "app: reviews", "10.96.0.10"),
        service("bookinfo", "ratings", "app: ratings", "10.96.0.11"),
    ));
    let key = |svc: &str| ResourceKey::new(TypeUrl::Route, &format!("bookinfo/{svc}.bookinfo.svc.cluster.local"));
    let rules = |ix: &Index, svc: &str| {
        ix.resources()
            .get(&key(svc))
            .map(|v| slipstream_api::routes::routes_from_any(&v.body).unwrap().jwt_rules)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.policy, r.issuer, r.jwks))
            .collect::<Vec<_>>()
    };
    let on_reviews = request_authn(
        "bookinfo",
        "reviews-jwt",
        &format!("{{targetRefs: [{{kind: Service, name: reviews}}], jwtRules: [{{issuer: b, jwks: '{JWKS}'}}]}}"),
    );
    let changes = upsert(&mut ix, &on_reviews);
    assert_eq!(changes.upserted, vec![key("reviews")]);
    assert_eq!(rules(&ix, "reviews"), [("bookinfo/reviews-jwt".into(), "b".into(), JWKS.into())]);
    assert!(rules(&ix, "ratings").is_empty());
    // On the waypoint: every service bound to it, ordered by issuer.
    let uri = "http://keys.auth.svc.cluster.local/jwks";
    let on_waypoint = request_authn(
        "bookinfo",
        "all",
        &format!("{{targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}}], jwtRules: [{{issuer: a, jwksUri: '{uri}'}}]}}"),
    );
    upsert(&mut ix, &on_waypoint);
    assert_eq!(
        rules(&ix, "reviews"),
        [("bookinfo/all".into(), "a".into(), String::new()), ("bookinfo/reviews-jwt".into(), "b".into(), JWKS.into())]
    );
    assert_eq!(rules(&ix, "ratings"), [("bookinfo/all".into(), "a".into(), String::new())]);
    let f = Fetch {
        url: uri.into(),
        namespace: "auth".into(),
        service: "keys".into(),
        port: 80,
        tls: false,
        timeout: std::time::Duration::from_secs(5),
    };
    // From its Service's cluster address, once there is one.
    assert_eq!(ix.jwks_fetches(), BTreeMap::from([(f.clone(), Err("no Service auth/keys".to_string()))]));
    upsert(&mut ix, &service("auth", "keys", "app: keys", "10.96.0.53"));
    assert_eq!(ix.jwks_fetches(), BTreeMap::from([(f.clone(), Ok("10.96.0.53:80".parse().unwrap()))]));
    // Fetched: the keys go to both.
    let changes = ix.set_jwks(&f, Some(JWKS.into()));
    assert_eq!(changes.upserted, vec![key("ratings"), key("reviews")]);
    assert_eq!(rules(&ix, "ratings"), [("bookinfo/all".into(), "a".into(), JWKS.into())]);
    assert!(ix.set_jwks(&f, Some(JWKS.into())).upserted.is_empty(), "the same keys again change nothing");
    // A selector-bound one is accepted and reaches nothing, nor is fetched.
    let inert = request_authn(
        "bookinfo",
        "sidecar",
        "{selector: {matchLabels: {app: reviews}}, jwtRules: [{issuer: c, jwksUri: 'http://other.auth.svc/jwks'}]}",
    );
    assert!(upsert(&mut ix, &inert).upserted.is_empty());
    assert_eq!(ix.jwks_fetches().len(), 1);
    // An invalid one is refused, naming the field; the last good one stays.
    let e = parse_manifests(&on_reviews.replace("issuer: b, ", "issuer: b, fromHeaders: [{prefix: x}], ")).unwrap_err();
    assert_eq!(e[0].field, "spec.jwtRules[0].fromHeaders[0].name", "{e:?}");
    // Gone: its rules go.
    ix.apply(ObjectEvent::Delete(ObjectRef::new(Kind::RequestAuthentication, "bookinfo", "all"))).unwrap();
    assert!(rules(&ix, "ratings").is_empty());
    assert!(ix.jwks_fetches().is_empty());
}
