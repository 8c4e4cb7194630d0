//! Waypoint Gateways: what changes a binding, which pods are a waypoint's,
//! what an object is bound to.

use super::*;
use crate::index::testing::pod;

fn waypoint(takes: TrafficType) -> GatewayInput {
    GatewayInput::Waypoint { takes, allowed: AllowedNamespaces::Same }
}

#[test]
fn only_a_change_of_what_binding_reads_is_a_change() {
    let mut w = Waypoints::default();
    let cases = [
        (GatewayInput::Other, false),
        (waypoint(TrafficType::Service), true),
        (waypoint(TrafficType::Service), false),
        (waypoint(TrafficType::All), true),
        (GatewayInput::Other, true),
        (GatewayInput::Other, false),
    ];
    for (i, (g, changed)) in cases.into_iter().enumerate() {
        assert_eq!(w.set("a", "wp", g), changed, "step {i}");
    }
    assert!(!w.any());
    assert!(!w.remove("a", "wp"), "an other Gateway is no waypoint");
    assert!(w.namespaces.is_empty());
}

#[test]
fn waypoints_are_listed_and_taken_by_kind_of_traffic() {
    let mut w = Waypoints::default();
    w.set("b", "svc-wp", waypoint(TrafficType::Service));
    w.set("a", "all-wp", waypoint(TrafficType::All));
    w.set("a", "pod-wp", waypoint(TrafficType::Workload));
    let listed: Vec<String> = w.list().iter().map(|w| format!("{}/{}", w.namespace, w.name)).collect();
    assert_eq!(listed, ["a/all-wp", "a/pod-wp", "b/svc-wp"]);
    let taking: Vec<(String, String)> = w.taking_workloads().collect();
    assert_eq!(taking, [("a".into(), "all-wp".into()), ("a".into(), "pod-wp".into())]);
    let cases = [
        ("a", "all-wp", Traffic::Service, true),
        ("a", "pod-wp", Traffic::Service, false),
        ("b", "svc-wp", Traffic::Service, true),
        ("b", "nope", Traffic::Service, false),
    ];
    for (ns, name, traffic, want) in cases {
        assert_eq!(w.takes(ns, name, traffic), want, "{ns}/{name}");
    }
}

#[test]
fn a_waypoints_pod_has_its_label_and_its_account() {
    let mut w = Waypoints::default();
    w.set("a", "wp", waypoint(TrafficType::Service));
    let settings = IndexSettings::default();
    let mut as_wp = pod("a", "wp-1", "gateway.networking.k8s.io/gateway-name: wp", "10.0.0.1");
    as_wp.service_account = "wp".into();
    let mut other_account = as_wp.clone();
    other_account.service_account = "default".into();
    let mut other_ns = as_wp.clone();
    other_ns.namespace = "b".into();
    let cases = [
        (as_wp.clone(), None),
        (other_account, Some("it runs as service account default, not wp")),
        (other_ns, Some("there is no waypoint Gateway wp")),
        (pod("a", "web", "app: web", "10.0.0.2"), Some("it has no gateway-name label")),
    ];
    for (p, want) in &cases {
        assert_eq!(w.not_waypoint_pod(p, &settings).as_deref(), *want, "{}/{}", p.namespace, p.name);
    }
    let mut workloads = Workloads::default();
    workloads.upsert_pod(as_wp);
    assert_eq!(w.pods(&workloads, &settings), BTreeSet::from([("a".into(), "wp-1".into(), "wp".into())]));
}

#[test]
fn an_object_asking_for_a_waypoint_is_bound_or_named_without_a_port() {
    let settings = IndexSettings::default();
    let list =
        [Waypoint { name: "wp".into(), namespace: "a".into(), takes: TrafficType::Service, allowed: AllowedNamespaces::Same, ready: true }];
    let use_wp: Labels = [("istio.io/use-waypoint".to_string(), "wp".to_string())].into();
    let cases = [
        (Traffic::Service, "a", use_wp.clone(), Some(wp::HBONE_LISTENER_PORT)),
        (Traffic::Workload, "a", use_wp.clone(), Some(0)),
        (Traffic::Service, "a", Labels::new(), None),
    ];
    for (traffic, ns, labels, want) in cases {
        let got = waypoint_of(&settings, traffic, ns, &Labels::new(), &labels, &list);
        assert_eq!(got.as_ref().map(|g| g.hbone_mtls_port), want, "{traffic:?} {labels:?}");
        if let Some(g) = got {
            assert_eq!(g.hostname, "wp.a.svc.cluster.local");
        }
    }
}
