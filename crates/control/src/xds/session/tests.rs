//! The session message by message: no sockets, no tasks.

use super::*;
use crate::resources::{Changes, Versioned};
use crate::store::{LogLimits, Store};
use slipstream_api::discovery::{DeltaDiscoveryResponse, Status};

const A: TypeUrl = TypeUrl::Address;
const Z: TypeUrl = TypeUrl::Authorization;

fn versioned(t: TypeUrl, body: &str) -> Arc<Versioned> {
    Arc::new(Versioned::new(prost_types::Any { type_url: t.as_str().into(), value: body.as_bytes().to_vec() }))
}

/// A store and the map the test edits.
struct World {
    store: Store,
    resources: Resources,
}

impl World {
    fn new(items: &[(TypeUrl, &str, &str)]) -> World {
        World::with_limits(items, LogLimits::default())
    }

    fn with_limits(items: &[(TypeUrl, &str, &str)], limits: LogLimits) -> World {
        let mut resources = Resources::new();
        for (t, name, body) in items {
            resources.insert(ResourceKey::new(*t, name), versioned(*t, body));
        }
        World { store: Store::with_limits(resources.clone(), limits), resources }
    }

    fn set(&mut self, t: TypeUrl, name: &str, body: &str) -> Arc<Published> {
        let k = ResourceKey::new(t, name);
        self.resources.insert(k.clone(), versioned(t, body));
        self.store.publish(self.resources.clone(), Changes { upserted: vec![k], removed: vec![] });
        self.store.current()
    }

    fn remove(&mut self, t: TypeUrl, name: &str) -> Arc<Published> {
        let k = ResourceKey::new(t, name);
        self.resources.remove(&k);
        self.store.publish(self.resources.clone(), Changes { upserted: vec![], removed: vec![k] });
        self.store.current()
    }

    fn version(&self, t: TypeUrl, name: &str) -> String {
        self.resources.get(&ResourceKey::new(t, name)).unwrap().version.to_string()
    }
}

/// The session's responses as a proxy decodes them.
fn request(s: &mut Session, req: DeltaDiscoveryRequest) -> Vec<DeltaDiscoveryResponse> {
    s.on_request(req).iter().map(Outgoing::to_message).collect()
}

fn publication(s: &mut Session, p: Arc<Published>) -> Vec<DeltaDiscoveryResponse> {
    s.on_publication(p).iter().map(Outgoing::to_message).collect()
}

fn subscribe(t: TypeUrl) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { type_url: t.as_str().into(), ..Default::default() }
}

fn ack(r: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { type_url: r.type_url.clone(), response_nonce: r.nonce.clone(), ..Default::default() }
}

fn nack(r: &DeltaDiscoveryResponse, why: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { error_detail: Some(Status { code: 3, message: why.into(), details: vec![] }), ..ack(r) }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

/// A session subscribed to both types by wildcard, its first responses ACKed.
fn synced(w: &World) -> Session {
    let mut s = Session::new("node1", w.store.current());
    for t in [A, Z] {
        let out = request(&mut s, subscribe(t));
        assert_eq!(out.len(), 1);
        assert!(request(&mut s, ack(&out[0])).is_empty());
    }
    s
}

#[test]
fn the_first_response_of_each_type_carries_everything_even_when_empty() {
    let w = World::new(&[(A, "w1", "1"), (A, "w2", "1")]);
    let mut s = Session::new("node1", w.store.current());
    let out = request(&mut s, subscribe(A));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, A.as_str());
    assert_eq!(names(&out[0]), ["w1", "w2"]);
    assert_eq!(out[0].resources[0].version, w.version(A, "w1"));
    assert!(out[0].resources[0].resource.is_some());
    assert!(out[0].removed_resources.is_empty());

    let out = request(&mut s, subscribe(Z));
    assert_eq!(out.len(), 1, "an empty first response: the proxy knows it has the full set");
    assert!(out[0].resources.is_empty() && out[0].removed_resources.is_empty());
    assert_eq!(out[0].type_url, Z.as_str());
}

#[test]
fn one_change_is_one_response_with_one_resource() {
    let mut w = World::new(&[(A, "w1", "1"), (A, "w2", "1"), (Z, "ns/p", "1")]);
    let mut s = synced(&w);
    let out = publication(&mut s, w.set(A, "w2", "2"));
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["w2"]);
    assert_eq!(out[0].resources[0].version, w.version(A, "w2"));
    assert_eq!(out[0].system_version_info, "1");

    let out = publication(&mut s, w.remove(Z, "ns/p"));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, Z.as_str());
    assert!(out[0].resources.is_empty());
    assert_eq!(out[0].removed_resources, ["ns/p"]);

    // Publishing the same content again sends nothing.
    let out = publication(&mut s, w.set(A, "w2", "2"));
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn changes_a_slow_proxy_slept_through_coalesce() {
    let mut w = World::new(&[(A, "w1", "1"), (A, "w2", "1")]);
    let mut s = synced(&w);
    w.set(A, "w1", "2");
    w.set(A, "w1", "3");
    w.remove(A, "w2");
    w.set(A, "w3", "1");
    let out = publication(&mut s, w.store.current());
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["w1", "w3"]);
    assert_eq!(out[0].resources[0].version, w.version(A, "w1"), "only the newest version");
    assert_eq!(out[0].removed_resources, ["w2"]);
}

#[test]
fn a_proxy_behind_the_log_gets_the_difference_from_the_maps() {
    let mut w = World::with_limits(&[(A, "w1", "1"), (A, "w2", "1")], LogLimits { generations: 2, keys: 100 });
    let mut s = synced(&w);
    for i in 0..5 {
        w.set(A, "w1", &format!("v{i}"));
    }
    w.remove(A, "w2");
    assert!(w.store.current().changed_since(0).is_none(), "the log no longer reaches back");
    let out = publication(&mut s, w.store.current());
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["w1"]);
    assert_eq!(out[0].removed_resources, ["w2"]);
}

#[test]
fn reconnecting_with_initial_versions_sends_only_the_difference() {
    let w = World::new(&[(A, "same", "1"), (A, "changed", "2"), (A, "new", "1"), (Z, "ns/p", "1")]);
    let mut s = Session::new("node1", w.store.current());
    let mut req = subscribe(A);
    req.initial_resource_versions = [
        ("same".to_string(), w.version(A, "same")),
        ("changed".to_string(), "0123456789abcdef".to_string()),
        ("gone".to_string(), "0123456789abcdef".to_string()),
    ]
    .into();
    let out = request(&mut s, req);
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["changed", "new"]);
    assert_eq!(out[0].removed_resources, ["gone"]);

    // Holding everything: an empty first response.
    let mut req = subscribe(Z);
    req.initial_resource_versions = [("ns/p".to_string(), w.version(Z, "ns/p"))].into();
    let out = request(&mut s, req);
    assert_eq!(out.len(), 1);
    assert!(out[0].resources.is_empty() && out[0].removed_resources.is_empty());
}

#[test]
fn a_nacked_resource_is_not_resent_until_it_changes() {
    let mut w = World::new(&[(A, "w1", "1"), (A, "w2", "1")]);
    let mut s = synced(&w);
    let bad = publication(&mut s, w.set(A, "w1", "bad")).remove(0);
    assert!(request(&mut s, nack(&bad, "w1: workload.addresses[0]: an address is 4 or 16 bytes")).is_empty());
    let p = &s.progress()[0];
    assert_eq!((p.nacks, p.nack_open, p.in_sync), (1, true, false));
    assert_eq!(p.last_nack.as_ref().unwrap().reason, "w1: workload.addresses[0]: an address is 4 or 16 bytes");
    assert_eq!(p.last_nack.as_ref().unwrap().generation, 1);
    assert_eq!(s.answered_through(), 1, "a NACK answers the generation too");

    // Another resource changes: only it is sent, not the refused one.
    let out = publication(&mut s, w.set(A, "w2", "2"));
    assert_eq!(names(&out[0]), ["w2"]);
    request(&mut s, ack(&out[0]));
    assert!(s.progress()[0].in_sync, "ACKed again");
    // Comparing the maps (as after a log overflow) does not resend it either.
    s.types[0].full_due = true;
    assert!(s.flush().is_empty());
    // Re-subscribing by name does not bring it back.
    request(&mut s, DeltaDiscoveryRequest { resource_names_subscribe: vec!["w1".into()], ..subscribe(A) });
    assert!(s.flush().is_empty());
    // A new version is sent.
    let out = publication(&mut s, w.set(A, "w1", "good"));
    assert_eq!(names(&out[0]), ["w1"]);
    assert_eq!(out[0].resources[0].version, w.version(A, "w1"));
}

#[test]
fn acks_move_the_answered_generation_and_sync_state() {
    let mut w = World::new(&[(A, "w1", "1")]);
    let mut s = synced(&w);
    assert_eq!(s.answered_through(), 0);
    assert!(s.progress().iter().all(|p| p.in_sync));
    let r1 = publication(&mut s, w.set(A, "w1", "2")).remove(0);
    let r2 = publication(&mut s, w.set(A, "w1", "3")).remove(0);
    assert_eq!(s.answered_through(), 0, "two responses unanswered");
    assert!(!s.progress()[0].in_sync);
    assert_eq!(s.progress()[0].sent_nonce, r2.nonce);
    request(&mut s, ack(&r1));
    assert_eq!(s.answered_through(), 1);
    request(&mut s, ack(&r2));
    assert_eq!(s.answered_through(), 2);
    assert_eq!(s.progress()[0].acked_nonce, r2.nonce);
    // A change of the other type answers nothing new for this one, but the
    // session is at generation 3 for both once that is ACKed.
    let r3 = publication(&mut s, w.set(Z, "ns/p", "1")).remove(0);
    assert_eq!(s.answered_through(), 2);
    request(&mut s, ack(&r3));
    assert_eq!(s.answered_through(), 3);
    assert!(s.progress().iter().all(|p| p.in_sync));
    // An ACK of an unknown nonce changes nothing.
    request(&mut s, DeltaDiscoveryRequest { response_nonce: "nope".into(), ..subscribe(A) });
    assert_eq!(s.answered_through(), 3);
}

#[test]
fn explicit_names_unsubscribe_and_absent_names() {
    let mut w = World::new(&[(A, "w1", "1"), (A, "w2", "1")]);
    let mut s = Session::new("node1", w.store.current());
    let out = request(&mut s, DeltaDiscoveryRequest { resource_names_subscribe: vec!["w1".into(), "ghost".into()], ..subscribe(A) });
    assert_eq!(names(&out[0]), ["w1"]);
    assert_eq!(out[0].removed_resources, ["ghost"], "told that a name it asked for does not exist");
    assert!(publication(&mut s, w.set(A, "w2", "2")).is_empty(), "not subscribed to w2");
    let out = request(&mut s, DeltaDiscoveryRequest { resource_names_subscribe: vec!["w2".into()], ..subscribe(A) });
    assert_eq!(names(&out[0]), ["w2"]);
    request(&mut s, DeltaDiscoveryRequest { resource_names_unsubscribe: vec!["w1".into()], ..subscribe(A) });
    assert!(publication(&mut s, w.set(A, "w1", "2")).is_empty(), "unsubscribed from w1");
    assert_eq!(s.progress()[0].resources, 1);
    // Wildcard on top: everything not held comes.
    let out = request(&mut s, DeltaDiscoveryRequest { resource_names_subscribe: vec!["*".into()], ..subscribe(A) });
    assert_eq!(names(&out[0]), ["w1"]);
    // ztunnel's "subscribe to nothing": * in and out in the first request.
    let mut s = Session::new("node1", w.store.current());
    let out = request(
        &mut s,
        DeltaDiscoveryRequest { resource_names_subscribe: vec!["*".into()], resource_names_unsubscribe: vec!["*".into()], ..subscribe(A) },
    );
    assert_eq!(out.len(), 1);
    assert!(out[0].resources.is_empty());
}

#[test]
fn unknown_types_are_not_answered() {
    let w = World::new(&[(A, "w1", "1")]);
    let mut s = Session::new("node1", w.store.current());
    let req = DeltaDiscoveryRequest { type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(), ..Default::default() };
    assert!(request(&mut s, req.clone()).is_empty());
    assert!(request(&mut s, req).is_empty());
    assert!(s.progress().is_empty());
    assert_eq!(s.unknown_types.len(), 1);
}

#[test]
fn a_stream_in_sync_shares_the_published_map() {
    let mut w = World::new(&[(A, "w1", "1"), (Z, "ns/p", "1")]);
    let mut s = synced(&w);
    assert!(s.held.ptr_eq(&w.store.current().resources));
    publication(&mut s, w.set(A, "w1", "2"));
    assert!(s.held.ptr_eq(&w.store.current().resources));
    assert_eq!(s.progress().iter().map(|p| p.resources).collect::<Vec<_>>(), [1, 1]);
}

#[test]
fn unanswered_responses_are_bounded() {
    let mut w = World::new(&[(A, "w1", "1")]);
    let mut s = synced(&w);
    for i in 0..100 {
        publication(&mut s, w.set(A, "w1", &format!("{i}")));
    }
    assert_eq!(s.types[0].unanswered.len(), MAX_UNANSWERED);
}
