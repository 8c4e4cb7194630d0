use super::*;
use crate::translate::waypoint::GATEWAY_NAME_LABEL;

fn settings() -> ControllerSettings {
    ControllerSettings {
        deploy: render::DeploySettings {
            image: "slipstream:test".into(),
            control_plane: "istiod.istio-system.svc:15012".into(),
            control_plane_san: "istiod.istio-system.svc".into(),
            root_pem: "PEM".into(),
            trust_domain: "cluster.local".into(),
            cluster_id: "Kubernetes".into(),
            audience: "istio-ca".into(),
        },
        domain: "cluster.local".into(),
        resync: Duration::from_secs(60),
    }
}

fn gateway() -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
           "metadata": {"name": "waypoint", "namespace": "shop", "uid": "u-1", "generation": 2},
           "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}})
}

fn service(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop", "labels": labels},
           "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}})
}

fn statuses(writes: &[Write]) -> Vec<(&str, &str, &Value)> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::Status { kind, name, status, .. } => Some((*kind, name.as_str(), status)),
            Write::Object(_) => None,
        })
        .collect()
}

#[test]
fn a_new_gateway_gets_its_objects_and_status_and_a_bound_service_its_condition() {
    let objects = vec![gateway(), service("reviews", json!({"istio.io/use-waypoint": "waypoint"})), service("other", json!({}))];
    let writes = plan(&objects, &settings(), &HashMap::new(), &HashMap::new(), "2026-11-27T00:00:00Z");
    let made: Vec<String> = writes.iter().filter(|w| matches!(w, Write::Object(_))).map(Write::describe).collect();
    assert_eq!(made, ["ServiceAccount shop/waypoint", "Deployment shop/waypoint", "Service shop/waypoint"]);
    let st = statuses(&writes);
    assert_eq!(st.len(), 2, "{st:?}");
    let (kind, name, gw) = st[0];
    assert_eq!((kind, name), ("Gateway", "waypoint"));
    let programmed = &gw["conditions"][1];
    assert_eq!((programmed["type"].as_str(), programmed["status"].as_str()), (Some("Programmed"), Some("False")));
    assert_eq!(programmed["lastTransitionTime"], "2026-11-27T00:00:00Z");
    assert_eq!(programmed["observedGeneration"], 2);
    let (kind, name, svc) = st[1];
    assert_eq!((kind, name), ("Service", "reviews"));
    assert_eq!(svc["conditions"][0]["reason"], "WaypointIsNotReady");
    assert!(svc["conditions"][0].get("observedGeneration").is_none(), "a Service has no generation");
}

#[test]
fn what_is_already_written_is_not_written_again() {
    let mut objects = vec![gateway(), service("reviews", json!({"istio.io/use-waypoint": "waypoint"}))];
    let first = plan(&objects, &settings(), &HashMap::new(), &HashMap::new(), "t1");
    // The API server now holds what was written.
    for w in &first {
        if let Write::Status { kind, name, status, .. } = w {
            let o = objects.iter_mut().find(|o| o["kind"] == *kind && o["metadata"]["name"] == name.as_str()).unwrap();
            o["status"] = status.clone();
        }
    }
    let applied: HashMap<(String, String), Vec<Value>> =
        [(("shop".to_string(), "waypoint".to_string()), render::objects(&objects[0], &settings().deploy).unwrap())].into();
    assert_eq!(plan(&objects, &settings(), &applied, &HashMap::new(), "t2"), vec![], "nothing differs");

    // A ready pod that only looks like the waypoint's (its labels and
    // account, another command) programs nothing.
    let mut spec = render::pod_template("waypoint", &settings().deploy)["spec"].clone();
    spec["containers"][0]["command"] = json!(["sh"]);
    objects.push(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lookalike", "namespace": "shop",
        "labels": {GATEWAY_NAME_LABEL: "waypoint"}}, "spec": spec, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    assert_eq!(plan(&objects, &settings(), &applied, &HashMap::new(), "t2"), vec![], "still not programmed");
    // The waypoint's pod becomes ready: Programmed turns True with a new
    // transition time, Accepted keeps its own; the service is bound.
    let spec = render::pod_template("waypoint", &settings().deploy)["spec"].clone();
    objects.push(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waypoint-1", "namespace": "shop",
        "labels": {GATEWAY_NAME_LABEL: "waypoint"}}, "spec": spec, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    let writes = plan(&objects, &settings(), &applied, &HashMap::new(), "t3");
    let st = statuses(&writes);
    assert_eq!(st.len(), 2, "{st:?}");
    let gw = st[0].2;
    assert_eq!((gw["conditions"][0]["type"].as_str(), gw["conditions"][0]["lastTransitionTime"].as_str()), (Some("Accepted"), Some("t1")));
    assert_eq!((gw["conditions"][1]["status"].as_str(), gw["conditions"][1]["lastTransitionTime"].as_str()), (Some("True"), Some("t3")));
    assert_eq!(st[1].2["conditions"][0]["reason"], "WaypointAccepted");

    // A changed spec (generation 3) is acknowledged even if nothing else moved.
    for w in &writes {
        if let Write::Status { kind, name, status, .. } = w {
            let o = objects.iter_mut().find(|o| o["kind"] == *kind && o["metadata"]["name"] == name.as_str()).unwrap();
            o["status"] = status.clone();
        }
    }
    objects[0]["metadata"]["generation"] = json!(3);
    let st = plan(&objects, &settings(), &applied, &HashMap::new(), "t4");
    assert_eq!(statuses(&st).len(), 1);
    assert_eq!(statuses(&st)[0].2["conditions"][1]["observedGeneration"], 3);
    assert_eq!(statuses(&st)[0].2["conditions"][1]["lastTransitionTime"], "t3");
}

#[test]
fn a_service_that_stops_asking_loses_the_condition_this_controller_wrote() {
    let mut svc = service("reviews", json!({}));
    svc["status"] = json!({"conditions": [{"type": status::WAYPOINT_BOUND, "status": "True", "reason": "WaypointAccepted", "message": "bound to shop/waypoint"}]});
    let services = |w: &[Write]| -> usize { statuses(w).into_iter().filter(|(kind, _, _)| *kind == "Service").count() };
    // Written by someone else: not ours to clear (and nothing is written
    // again and again).
    assert_eq!(services(&plan(&[gateway(), svc.clone()], &settings(), &HashMap::new(), &HashMap::new(), "t")), 0);
    // Ours (the mirror read it from managedFields): cleared by applying nothing.
    svc[STATUS_OWNED] = json!(true);
    let writes = plan(&[gateway(), svc], &settings(), &HashMap::new(), &HashMap::new(), "t");
    let st: Vec<_> = statuses(&writes).into_iter().filter(|(kind, _, _)| *kind == "Service").collect();
    assert_eq!(st, vec![("Service", "reviews", &json!({}))]);
    // A Gateway that left the waypoint class loses its conditions too.
    let mut gw = gateway();
    gw["spec"]["gatewayClassName"] = json!("istio");
    gw[STATUS_OWNED] = json!(true);
    let st = plan(&[gw], &settings(), &HashMap::new(), &HashMap::new(), "t");
    assert_eq!(statuses(&st), vec![("Gateway", "waypoint", &json!({}))]);
}

#[test]
fn a_gateway_whose_names_are_taken_deploys_nothing_and_says_why() {
    let objects = vec![gateway()];
    let conflicts: HashMap<GatewayKey, String> =
        [(("shop".to_string(), "waypoint".to_string()), "ServiceAccount shop/waypoint already exists".to_string())].into();
    let writes = plan(&objects, &settings(), &HashMap::new(), &conflicts, "t");
    assert!(writes.iter().all(|w| !matches!(w, Write::Object(_))), "nothing applied over someone else's object");
    let st = statuses(&writes);
    let programmed = &st[0].2["conditions"][1];
    assert_eq!((programmed["status"].as_str(), programmed["reason"].as_str()), (Some("False"), Some("Invalid")));
    assert!(programmed["message"].as_str().unwrap().contains("already exists"));
}

#[test]
fn objects_being_deleted_are_left_alone() {
    let mut gw = gateway();
    gw["metadata"]["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
    let mut svc = service("reviews", json!({"istio.io/use-waypoint": "waypoint"}));
    svc["metadata"]["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
    let writes = plan(&[gw, svc], &settings(), &HashMap::new(), &HashMap::new(), "t");
    assert_eq!(writes, vec![]);
}

#[test]
fn a_changed_rendering_is_applied_again() {
    let objects = vec![gateway()];
    let mut applied: HashMap<(String, String), Vec<Value>> =
        [(("shop".to_string(), "waypoint".to_string()), render::objects(&objects[0], &settings().deploy).unwrap())].into();
    let objects_written = |w: &[Write]| w.iter().filter(|w| matches!(w, Write::Object(_))).count();
    assert_eq!(objects_written(&plan(&objects, &settings(), &applied, &HashMap::new(), "t")), 0);
    let mut rotated = settings();
    rotated.deploy.root_pem = "NEW PEM".into();
    assert_eq!(objects_written(&plan(&objects, &rotated, &applied, &HashMap::new(), "t")), 3, "a new root rolls the waypoint");
    applied.clear();
    assert_eq!(objects_written(&plan(&objects, &settings(), &applied, &HashMap::new(), "t")), 3, "a resync applies everything");
}

#[test]
fn the_mirror_is_synced_once_every_kind_it_reads_was_listed() {
    let m = Mirror::default();
    for kind in ["Namespace", "Service", "Pod"] {
        m.observe(&RawEvent::Relisted { kind, present: BTreeSet::new() });
        assert!(!m.synced(), "not before Gateway");
    }
    m.observe(&RawEvent::Relisted { kind: "ConfigMap", present: BTreeSet::new() });
    assert!(!m.synced());
    // A cluster without the Gateway CRD: nothing of it to wait for.
    m.observe(&RawEvent::Absent { kind: "Gateway" });
    assert!(m.synced());
}

#[test]
fn the_mirror_remembers_whose_status_it_is() {
    let m = Mirror::default();
    let mut svc = service("reviews", json!({}));
    svc["metadata"]["managedFields"] = json!([
        {"manager": "kube-controller-manager", "subresource": "status", "fieldsV1": {"f:status": {"f:loadBalancer": {}}}},
    ]);
    m.observe(&RawEvent::Apply(svc.clone()));
    assert!(m.snapshot()[0].get(STATUS_OWNED).is_none());
    svc["metadata"]["managedFields"] = json!([
        {"manager": STATUS_MANAGER, "subresource": "status", "fieldsV1": {"f:status": {"f:conditions": {}}}},
    ]);
    m.observe(&RawEvent::Apply(svc));
    assert_eq!(m.snapshot()[0][STATUS_OWNED], true);
}

#[test]
fn the_mirror_keeps_only_what_the_controller_reads() {
    let m = Mirror::default();
    m.observe(&RawEvent::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": "shop"}})));
    m.observe(&RawEvent::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "shop"}})));
    assert!(m.snapshot().is_empty(), "pods of applications and other kinds are not kept");
    m.observe(&RawEvent::Apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wp", "namespace": "shop", "labels": {GATEWAY_NAME_LABEL: "waypoint"}, "managedFields": [{}]}})));
    m.observe(&RawEvent::Apply(service("reviews", json!({}))));
    let snap = m.snapshot();
    assert_eq!(snap.len(), 2);
    assert!(snap.iter().all(|o| o["metadata"].get("managedFields").is_none()));
    m.observe(&RawEvent::Relisted { kind: "Service", present: BTreeSet::new() });
    assert_eq!(m.snapshot().len(), 1, "a relist without it drops the service");
    m.observe(&RawEvent::Delete { kind: "Pod", namespace: "shop".into(), name: "wp".into() });
    assert!(m.snapshot().is_empty());
}
