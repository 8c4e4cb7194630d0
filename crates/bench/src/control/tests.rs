//! The generator stays valid: what `bench-control` writes is what the
//! control plane's index takes, with the resources the figures assume.
//! (No timing here: the benchmark measures, tests never time.)

use super::synthetic::{Cluster, PodChange};
use super::ControlBenchArgs;
use slipstream_api::TypeUrl;
use slipstream_control::index::{Index, IndexSettings};
use slipstream_control::resources::ResourceKey;
use slipstream_control::source::ObjectEvent;
use slipstream_control::translate::parse_manifests;

fn quick() -> ControlBenchArgs {
    ControlBenchArgs { pods: 10_000, services: 1000, policies: 1000, namespaces: 100, proxies: 100, changes: 100, quick: true, out: None }
}

#[test]
fn quick_is_smaller_and_explicit_flags_win() {
    let (shape, changes) = quick().plan();
    assert_eq!((shape.pods, shape.services, shape.policies, shape.namespaces, shape.nodes, changes), (1000, 100, 100, 10, 10, 20));
    let (shape, _) = ControlBenchArgs { pods: 300, ..quick() }.plan();
    assert_eq!(shape.pods, 300);
    assert_eq!(ControlBenchArgs { pods: 300, ..quick() }.command(), "slipstream bench-control --quick --pods 300");
}

#[test]
fn the_generated_cluster_is_what_the_index_takes() {
    let (shape, changes) = quick().plan();
    let cluster = Cluster::new(shape, "bench");
    let mut index = Index::new(IndexSettings { cluster_id: "bench".into(), ..Default::default() });
    for f in cluster.files() {
        let objects = parse_manifests(&f.text).unwrap_or_else(|e| panic!("{}: {e:?}", f.path.display()));
        assert_eq!(objects.len(), 1, "{}", f.path.display());
        for o in objects {
            index.apply(ObjectEvent::Upsert(o)).unwrap_or_else(|e| panic!("{}: {e}", f.path.display()));
        }
    }
    let r = index.resources();
    let count = |t: TypeUrl| r.keys().filter(|k| k.type_url == t).count();
    // A workload per pod and a service per service; a policy per policy.
    assert_eq!(count(TypeUrl::Address), shape.pods + shape.services);
    assert_eq!(count(TypeUrl::Authorization), shape.policies);
    // Every pod is in its service, and selected by its service's policies.
    let mesh = index.mesh_config();
    assert!(mesh.workloads.iter().all(|w| w.services.len() == 1), "every pod backs one service");
    let p1 = mesh.workloads.iter().find(|w| w.name == "p1").unwrap();
    assert_eq!(p1.authorization_policies.len(), 1, "{p1:?}");
    assert_eq!(p1.node, "node2");

    // Each change is one pod's file, and changes exactly its workload.
    for i in 0..changes {
        let (p, what) = cluster.change(i);
        let f = cluster.pod(p, Some(what));
        let mut objects = parse_manifests(&f.text).unwrap();
        let changed = index.apply(ObjectEvent::Upsert(objects.remove(0))).unwrap();
        assert_eq!(changed.upserted, [ResourceKey::new(TypeUrl::Address, &cluster.workload_name(p))], "change {i}: {what:?}");
        assert!(changed.removed.is_empty());
    }
    assert!(matches!(cluster.change(0).1, PodChange::NotReady));
}
