use super::*;
use slipstream_k8s::{load_str, Source};

fn objs(y: &str) -> Vec<Object> {
    load_str(y, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect()
}

const NODES: &[&str] = &["node1", "node2"];

fn facts<'a>(nodes: &'a [String], vips: &'a BTreeMap<(String, String), Ipv4Addr>) -> ClusterFacts<'a> {
    ClusterFacts { nodes, vips }
}

const APP: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: web, namespace: demo}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: demo}\nspec: {serviceAccountName: web, nodeName: node2, containers: [{name: c, command: [sleep, infinity]}]}\n";

#[test]
fn namespace_in_the_same_apply_counts_and_lines_say_what_changed() {
    let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let vips = BTreeMap::new();
    let (s, lines) = Store::new().plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
    assert_eq!(lines, vec!["namespace/demo created", "serviceaccount/web (demo) created", "pod/web (demo) created"]);
    let (_, lines) = s.plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
    assert!(lines.iter().all(|l| l.ends_with("unchanged")), "{lines:?}");
}

#[test]
fn missing_references_reject_the_whole_apply() {
    let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let vips = BTreeMap::new();
    let y = APP.replace("name: demo}\n---", "name: demo2}\n---").replace("nodeName: node2", "nodeName: node7");
    let errs = Store::new().plan_apply(objs(&y), &facts(&nodes, &vips)).unwrap_err();
    let all = errs.join("\n");
    assert!(all.contains("ServiceAccount demo/web: metadata.namespace: namespace \"demo\" does not exist"), "{all}");
    assert!(all.contains("Pod demo/web: metadata.namespace"), "{all}");
    let y = APP.replace("serviceAccountName: web", "serviceAccountName: nobody").replace("nodeName: node2", "nodeName: node7");
    let all = Store::new().plan_apply(objs(&y), &facts(&nodes, &vips)).unwrap_err().join("\n");
    assert!(
        all.contains("Pod demo/web: spec.serviceAccountName: service account \"nobody\" does not exist in namespace \"demo\""),
        "{all}"
    );
    assert!(all.contains("Pod demo/web: spec.nodeName: node \"node7\" does not exist (the cluster has node1, node2)"), "{all}");
}

#[test]
fn cluster_ip_rules() {
    let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let mut vips = BTreeMap::new();
    vips.insert(("default".to_string(), "a".to_string()), Ipv4Addr::new(10, 96, 0, 10));
    let svc = |name: &str, ip: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")
    };
    let e = Store::new().plan_apply(objs(&svc("b", "10.96.0.10")), &facts(&nodes, &vips)).unwrap_err();
    assert!(e[0].contains("Service default/b: spec.clusterIP: 10.96.0.10 is already allocated to service default/a"), "{e:?}");
    let e = Store::new().plan_apply(objs(&svc("b", "10.1.0.10")), &facts(&nodes, &vips)).unwrap_err();
    assert!(e[0].contains("outside the service range"), "{e:?}");
    let (s, _) = Store::new().plan_apply(objs(&svc("a", "10.96.0.10")), &facts(&nodes, &vips)).unwrap();
    let e = s.plan_apply(objs(&svc("a", "10.96.0.99")), &facts(&nodes, &vips)).unwrap_err();
    assert!(e[0].contains("spec.clusterIP: is immutable (currently 10.96.0.10)"), "{e:?}");
}

fn deployment(name: &str, replicas: usize, node: Option<&str>) -> String {
    let pin = node.map(|n| format!("nodeName: {n}, ")).unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{{pin}containers: [{{name: c, command: [sleep, infinity]}}]}}\n"
    )
}

fn pod(name: &str, node: Option<&str>) -> String {
    let pin = node.map(|n| format!("nodeName: {n}, ")).unwrap_or_default();
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{{pin}containers: [{{name: c, command: [sleep, infinity]}}]}}\n")
}

#[test]
fn capacity_is_refused_naming_the_object_and_field() {
    let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let vips = BTreeMap::new();
    // The store holds 3 pods already (one Deployment of 2, one Pod).
    let base = format!("{}---\n{}", deployment("old", 2, None), pod("solo", None));
    let (s, _) = Store::new().plan_apply(objs(&base), &facts(&nodes, &vips)).unwrap();
    // (manifest, the errors wanted; empty = accepted)
    let cases: Vec<(String, Vec<&str>)> = vec![
        (deployment("web", 217, None), vec![]),
        (
            deployment("web", 10000, None),
            vec!["Deployment default/web: spec.replicas: 10000 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed)"],
        ),
        (
            format!("{}---\n{}", deployment("a", 200, None), deployment("b", 20, None)),
            vec![
                "Deployment default/a: spec.replicas: 200 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed, 20 more in this apply)",
                "Deployment default/b: spec.replicas: 20 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed, 200 more in this apply)",
            ],
        ),
        // Changing an existing object counts its new size only.
        (deployment("old", 219, None), vec![]),
        (deployment("old", 110, Some("node1")), vec![]),
        (
            deployment("old", 111, Some("node1")),
            vec!["Deployment default/old: spec.template.spec.nodeName: 111 pods pinned to node \"node1\" would exceed its capacity (110 pods, 0 pinned there by other objects)"],
        ),
        (
            format!("{}---\n{}", deployment("web", 110, Some("node2")), pod("p", Some("node2"))),
            vec!["Deployment default/web: spec.template.spec.nodeName: 110 pods pinned to node \"node2\" would exceed its capacity (110 pods, 1 pinned there by other objects)",
                "Pod default/p: spec.nodeName: 1 pod pinned to node \"node2\" would exceed its capacity (110 pods, 110 pinned there by other objects)"],
        ),
    ];
    for (y, want) in cases {
        match s.plan_apply(objs(&y), &facts(&nodes, &vips)) {
            Ok(_) => assert!(want.is_empty(), "accepted, wanted {want:?} for\n{y}"),
            Err(e) => assert_eq!(e, want, "for\n{y}"),
        }
    }
    // One node: 110 in all.
    let one = vec!["node1".to_string()];
    let e = Store::new().plan_apply(objs(&deployment("web", 111, None)), &facts(&one, &vips)).unwrap_err();
    assert_eq!(e, vec!["Deployment default/web: spec.replicas: 111 pods would exceed the cluster's capacity (1 node x 110 pods = 110, 0 already placed)"]);
}

#[test]
fn label_and_annotate_as_kubectl_does() {
    let nodes = vec!["node1".to_string()];
    let vips = BTreeMap::new();
    let store = Store::new();
    let ns = key("Namespace", "", "default");
    let set = |k: &str, v: Option<&str>| vec![(k.to_string(), v.map(String::from))];
    let (s1, lines) = store.plan_label(&ns, &set("istio.io/dataplane-mode", Some("ambient")), false, false, &facts(&nodes, &vips)).unwrap();
    assert_eq!(lines, ["namespace/default labeled"]);
    assert_eq!(s1.get(&ns).unwrap().metadata().labels["istio.io/dataplane-mode"], "ambient");
    // Another value needs --overwrite; the same value changes nothing.
    let e = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("none")), false, false, &facts(&nodes, &vips)).unwrap_err();
    assert_eq!(e, ["'istio.io/dataplane-mode' already has a value (ambient), and --overwrite is false"]);
    let (_, lines) = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("ambient")), false, false, &facts(&nodes, &vips)).unwrap();
    assert_eq!(lines, ["namespace/default not labeled"]);
    let (s2, _) = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("none")), true, false, &facts(&nodes, &vips)).unwrap();
    assert_eq!(s2.get(&ns).unwrap().metadata().labels["istio.io/dataplane-mode"], "none");
    // key- removes; a missing key is said, not an error.
    let (s3, lines) = s2.plan_label(&ns, &set("istio.io/dataplane-mode", None), false, false, &facts(&nodes, &vips)).unwrap();
    assert!(s3.get(&ns).unwrap().metadata().labels.is_empty());
    assert_eq!(lines, ["namespace/default labeled"]);
    let (_, lines) = s3.plan_label(&ns, &set("nothing", None), false, false, &facts(&nodes, &vips)).unwrap();
    assert_eq!(lines, ["label \"nothing\" not found.", "namespace/default not labeled"]);
    // Annotations take any value; labels are checked.
    let (s4, lines) = s3.plan_label(&ns, &set("note", Some("a value with spaces")), false, true, &facts(&nodes, &vips)).unwrap();
    assert_eq!(
        (lines[0].as_str(), s4.get(&ns).unwrap().metadata().annotations["note"].as_str()),
        ("namespace/default annotated", "a value with spaces")
    );
    assert!(s3.plan_label(&ns, &set("bad", Some("a value with spaces")), false, false, &facts(&nodes, &vips)).is_err());
    // Unknown objects are named as kubectl names them.
    let e = store.plan_label(&key("Service", "default", "nope"), &set("a", Some("b")), false, false, &facts(&nodes, &vips)).unwrap_err();
    assert_eq!(e, ["services \"nope\" not found in namespace default"]);
}

#[test]
fn deleting_a_namespace_cascades_and_builtins_stay() {
    let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
    let vips = BTreeMap::new();
    let (s, _) = Store::new().plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
    let (s2, lines) = s.plan_delete(&[key("Namespace", "", "demo")], false).unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(s2.get(&key("Pod", "demo", "web")).is_none());
    // A file that deletes a namespace and what is inside it (the usual
    // `delete -f` of the file that created them) is not "not found".
    let (_, lines) = s.plan_delete(&[key("Namespace", "", "demo"), key("Pod", "demo", "web")], false).unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(s.plan_delete(&[key("Namespace", "", "default")], false).is_err());
    let e = s.plan_delete(&[key("Pod", "demo", "nope")], false).unwrap_err();
    assert_eq!(e, vec!["Pod demo/nope: not found"]);
    assert!(s.plan_delete(&[key("Pod", "demo", "nope")], true).is_ok());
}
