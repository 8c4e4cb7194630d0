//! The one mutable owner of the mesh model. Configuration sources hand it
//! resources by name, as the workload API names them (a workload by its
//! uid, a service by `namespace/hostname`, a policy by `namespace/name`);
//! it validates each as it arrives and publishes immutable
//! [`MeshState`] snapshots for the data path.
//!
//! **Validation.** A resource the data path could not use is refused with a
//! [`ResourceError`] naming the resource and the field, and the index keeps
//! the previous version of that resource (if any): one bad update never
//! takes a working resource away.
//!
//! **Secondary indexes**, kept on every upsert and removal: address ->
//! workload, VIP -> service, hostname -> service, service -> member
//! workloads (from each workload's `services`), namespace -> policies.
//! Membership belongs to the workloads: a workload may name a service that
//! arrives later, and a service removed and added again finds its members
//! where they were.
//!
//! **Contested addresses.** An address (or VIP, or hostname) listed by two
//! resources belongs to the one that claimed it last. A claim dates from
//! the upsert that first listed the address; an update that keeps the
//! address keeps its claim's age (so an update of an old pod does not take
//! back an address a new pod has since claimed). Removing a resource, or
//! the address from it, withdraws only its own claim: removing the older
//! claimant leaves the newer one's entry alone, and removing the newer one
//! hands the address back to the older, which still lists it.

use crate::policy::network::NetPolicy;
use crate::policy::Authorization;
use crate::spiffe::{SpiffeId, SpiffeIdError};
use crate::state::{Claims, MeshService, MeshState, MeshWorkload};
use crate::workload::{Service, Workload};
use imbl::{HashMap, OrdSet};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

mod validate;
use validate::*;

/// What an upsert or removal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A resource of that name was not held; it is now.
    Added,
    /// It replaced a different version.
    Updated,
    /// The same version was already held; nothing changed.
    Unchanged,
    Removed,
    /// Removal of a name that was not held; nothing changed.
    Absent,
}

impl Change {
    /// Whether the snapshot differs after it.
    pub fn changed(self) -> bool {
        matches!(self, Change::Added | Change::Updated | Change::Removed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    Workload,
    Service,
    Policy,
    NetPolicy,
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceKind::Workload => "workload",
            ResourceKind::Service => "service",
            ResourceKind::Policy => "policy",
            ResourceKind::NetPolicy => "network policy",
        })
    }
}

/// A resource refused at the boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name}: {field}: {message}")]
pub struct ResourceError {
    pub kind: ResourceKind,
    /// The resource's name: a workload's uid (`namespace/name` when the uid
    /// itself is missing), a service's `namespace/hostname`, a policy's
    /// `namespace/name`.
    pub name: String,
    /// The refused field, as a path into the resource's serde form:
    /// `addresses`, `ports[1].service_port`, `subject_alt_names[0]`,
    /// `services["default/echo.default.svc.cluster.local"][0].service_port`.
    pub field: String,
    pub message: String,
}

/// What applying a whole configuration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub unchanged: usize,
    /// The refused resources; the index kept their previous versions.
    pub errors: Vec<ResourceError>,
}

impl ApplyReport {
    /// Whether the snapshot differs after it.
    pub fn changed(&self) -> bool {
        self.added + self.updated + self.removed > 0
    }

    fn count(&mut self, change: Change) {
        match change {
            Change::Added => self.added += 1,
            Change::Updated => self.updated += 1,
            Change::Removed => self.removed += 1,
            Change::Unchanged | Change::Absent => self.unchanged += 1,
        }
    }

    fn record(&mut self, result: Result<Change, ResourceError>) {
        match result {
            Ok(change) => self.count(change),
            Err(e) => self.errors.push(e),
        }
    }
}

impl fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} added, {} updated, {} removed, {} unchanged, {} refused",
            self.added,
            self.updated,
            self.removed,
            self.unchanged,
            self.errors.len()
        )
    }
}

/// The mutable mesh model. One owner (the configuration task) changes it;
/// everyone else reads [`snapshot`](MeshIndex::snapshot)s.
#[derive(Debug, Default)]
pub struct MeshIndex {
    state: MeshState,
    /// Workloads received without an address (a pod scheduled whose
    /// address the API does not know yet): not on the data path, kept so
    /// that the node proxy of their node can give them the address its
    /// CNI reported ([`MeshIndex::fill_address`]).
    unaddressed: std::collections::HashMap<String, Workload>,
}

impl MeshIndex {
    /// The current state, published: O(1), it clones persistent maps.
    pub fn snapshot(&self) -> Arc<MeshState> {
        Arc::new(self.state.clone())
    }

    /// Adds or replaces the workload named by `w.uid`. One without an
    /// address is no error (the control plane publishes a pod as soon as
    /// it is scheduled, so that its node proxy can name it before the API
    /// knows its address): it leaves the data path and is kept aside.
    pub fn upsert_workload(&mut self, w: Workload) -> Result<Change, ResourceError> {
        if w.addresses.is_empty() && !w.uid.is_empty() {
            // Refused as any other version would be (its identity, its
            // services), the previous version kept: checked with a
            // stand-in address.
            validate_workload(Workload { addresses: vec![IpAddr::from([0, 0, 0, 0])], ..w.clone() })?;
            let uid = w.uid.clone();
            self.unaddressed.insert(uid.clone(), w);
            return Ok(self.remove_live_workload(&uid));
        }
        self.unaddressed.remove(w.uid.as_str());
        let held = self.state.workloads.get(w.uid.as_str()).cloned();
        if held.as_ref().is_some_and(|h| *h.workload() == w) {
            return Ok(Change::Unchanged);
        }
        let new = Arc::new(validate_workload(w)?);
        let uid: Arc<str> = new.uid.as_str().into();
        let st = &mut self.state;
        st.workloads.insert(uid.clone(), new.clone());

        let old_addresses: BTreeSet<IpAddr> = held.iter().flat_map(|h| h.addresses.iter().copied()).collect();
        let new_addresses: BTreeSet<IpAddr> = new.addresses.iter().copied().collect();
        for a in old_addresses.difference(&new_addresses) {
            withdraw(&mut st.by_address, a, &uid);
        }
        for a in new_addresses.difference(&old_addresses) {
            claim(&mut st.by_address, *a, &uid);
        }

        let old_services: BTreeSet<&str> = held.iter().flat_map(|h| h.services.keys().map(String::as_str)).collect();
        let new_services: BTreeSet<&str> = new.services.keys().map(String::as_str).collect();
        for k in old_services.difference(&new_services) {
            leave(&mut st.members, k, &uid);
        }
        for k in new_services.difference(&old_services) {
            join(&mut st.members, k, &uid);
        }
        Ok(if held.is_some() { Change::Updated } else { Change::Added })
    }

    pub fn remove_workload(&mut self, uid: &str) -> Change {
        let aside = self.unaddressed.remove(uid).is_some();
        match self.remove_live_workload(uid) {
            Change::Absent if aside => Change::Unchanged,
            c => c,
        }
    }

    /// A workload received without an address, as received.
    pub fn unaddressed(&self, uid: &str) -> Option<&Workload> {
        self.unaddressed.get(uid)
    }

    /// Puts a workload received without an address on the data path with
    /// `ip`, the address its node's CNI gave it (the node proxy's own pods
    /// only: it alone knows it). A later version from the control plane
    /// replaces it; one still without an address sets it aside again.
    pub fn fill_address(&mut self, uid: &str, ip: IpAddr) -> Result<Change, ResourceError> {
        let Some(w) = self.unaddressed.get(uid).cloned() else { return Ok(Change::Absent) };
        let r = self.upsert_workload(Workload { addresses: vec![ip], ..w.clone() });
        if r.is_err() {
            // Refused (its identity, say): kept aside as received.
            self.unaddressed.insert(uid.to_string(), w);
        }
        r
    }

    fn remove_live_workload(&mut self, uid: &str) -> Change {
        let st = &mut self.state;
        let Some(old) = st.workloads.remove(uid) else {
            return Change::Absent;
        };
        for a in &old.addresses {
            withdraw(&mut st.by_address, a, uid);
        }
        for k in old.services.keys() {
            leave(&mut st.members, k, uid);
        }
        Change::Removed
    }

    /// Adds or replaces the service named by `s.key()`. Its members are the
    /// workloads that name it, whenever they arrived.
    pub fn upsert_service(&mut self, s: Service) -> Result<Change, ResourceError> {
        let held = self.state.services.get(s.key().as_str()).cloned();
        if held.as_ref().is_some_and(|h| *h.service() == s) {
            return Ok(Change::Unchanged);
        }
        let new = Arc::new(validate_service(s)?);
        let key = new.key_arc().clone();
        let st = &mut self.state;
        st.services.insert(key.clone(), new.clone());

        let old_vips: BTreeSet<IpAddr> = held.iter().flat_map(|h| h.addresses.iter().map(|a| a.address)).collect();
        let new_vips: BTreeSet<IpAddr> = new.addresses.iter().map(|a| a.address).collect();
        for a in old_vips.difference(&new_vips) {
            withdraw(&mut st.by_vip, a, &key);
        }
        for a in new_vips.difference(&old_vips) {
            claim(&mut st.by_vip, *a, &key);
        }

        // The key holds the hostname, so it changes only if two spellings
        // of a name collide (`a/b` + `c` and `a` + `b/c`); handled anyway.
        let old_hostname = held.as_ref().map(|h| h.hostname());
        if old_hostname != Some(new.hostname()) {
            if let Some(h) = old_hostname {
                withdraw(&mut st.by_hostname, h, &key);
            }
            claim(&mut st.by_hostname, new.hostname().clone(), &key);
        }
        Ok(if held.is_some() { Change::Updated } else { Change::Added })
    }

    /// Removes a service (by `namespace/hostname`). The membership of its
    /// workloads stays: it is theirs, and serves the service if it returns.
    pub fn remove_service(&mut self, key: &str) -> Change {
        let st = &mut self.state;
        let Some(old) = st.services.remove(key) else {
            return Change::Absent;
        };
        for a in &old.addresses {
            withdraw(&mut st.by_vip, &a.address, key);
        }
        withdraw(&mut st.by_hostname, old.hostname(), key);
        Change::Removed
    }

    /// Adds or replaces the policy named by `p.key()`.
    pub fn upsert_policy(&mut self, p: Authorization) -> Result<Change, ResourceError> {
        let key: Arc<str> = p.key().into();
        let held = self.state.policies.get(&key).cloned();
        if held.as_ref().is_some_and(|h| **h == p) {
            return Ok(Change::Unchanged);
        }
        validate_policy(&p)?;
        let st = &mut self.state;
        let new_namespace = p.namespace.clone();
        st.policies.insert(key.clone(), Arc::new(p));
        // As for services: the namespace changes under one key only if two
        // spellings of a name collide.
        let old_namespace = held.as_ref().map(|h| h.namespace.as_str());
        if old_namespace != Some(new_namespace.as_str()) {
            if let Some(ns) = old_namespace {
                leave(&mut st.policies_by_namespace, ns, &key);
            }
            join(&mut st.policies_by_namespace, &new_namespace, &key);
        }
        Ok(if held.is_some() { Change::Updated } else { Change::Added })
    }

    /// Removes a policy (by `namespace/name`).
    pub fn remove_policy(&mut self, key: &str) -> Change {
        let st = &mut self.state;
        let Some(old) = st.policies.remove(key) else {
            return Change::Absent;
        };
        leave(&mut st.policies_by_namespace, &old.namespace, key);
        Change::Removed
    }

    /// Adds or replaces the network policy named by `p.key()`.
    pub fn upsert_net_policy(&mut self, p: NetPolicy) -> Result<Change, ResourceError> {
        let key: Arc<str> = p.key().into();
        let held = self.state.net_policies.get(&key).cloned();
        if held.as_ref().is_some_and(|h| **h == p) {
            return Ok(Change::Unchanged);
        }
        validate_net_policy(&p)?;
        let st = &mut self.state;
        if let Some(old) = &held {
            for uid in &old.selected {
                leave(&mut st.net_by_workload, uid, &key);
            }
        }
        for uid in &p.selected {
            join(&mut st.net_by_workload, uid, &key);
        }
        st.net_policies.insert(key, Arc::new(p));
        Ok(if held.is_some() { Change::Updated } else { Change::Added })
    }

    /// Removes a network policy (by `Kind/namespace/name`).
    pub fn remove_net_policy(&mut self, key: &str) -> Change {
        let st = &mut self.state;
        let Some(old) = st.net_policies.remove(key) else {
            return Change::Absent;
        };
        for uid in &old.selected {
            leave(&mut st.net_by_workload, uid, key);
        }
        Change::Removed
    }

    /// State-of-the-world input (a whole `MeshConfig`, e.g. the local
    /// cluster's file): computes the difference against what is held and
    /// applies only that, through the same upserts and removals an
    /// incremental source uses. Held resources the config does not name are
    /// removed; named ones that differ from the held version are upserted.
    ///
    /// A resource that fails validation is reported and the previous
    /// version of it (if any) is kept; so is a second resource of the same
    /// name in one config (the first one is applied), since a
    /// state-of-the-world document names each resource once.
    pub fn apply_config(&mut self, cfg: &MeshConfig) -> ApplyReport {
        let mut report = ApplyReport::default();

        // Removals first: an address that moves from a removed resource to
        // a new one is never contested on the way.
        let uids: HashSet<&str> = cfg.workloads.iter().map(|w| w.uid.as_str()).collect();
        let service_keys: HashSet<String> = cfg.services.iter().map(Service::key).collect();
        let policy_keys: HashSet<String> = cfg.policies.iter().map(Authorization::key).collect();
        let gone: Vec<Arc<str>> = self.state.workloads.keys().filter(|k| !uids.contains(&***k)).cloned().collect();
        for uid in gone {
            report.count(self.remove_workload(&uid));
        }
        self.unaddressed.retain(|uid, _| uids.contains(uid.as_str()));
        let gone: Vec<Arc<str>> = self.state.services.keys().filter(|k| !service_keys.contains(&***k)).cloned().collect();
        for key in gone {
            report.count(self.remove_service(&key));
        }
        let gone: Vec<Arc<str>> = self.state.policies.keys().filter(|k| !policy_keys.contains(&***k)).cloned().collect();
        for key in gone {
            report.count(self.remove_policy(&key));
        }
        let net_keys: HashSet<String> = cfg.net_policies.iter().map(NetPolicy::key).collect();
        let gone: Vec<Arc<str>> = self.state.net_policies.keys().filter(|k| !net_keys.contains(&***k)).cloned().collect();
        for key in gone {
            report.count(self.remove_net_policy(&key));
        }

        let mut seen = HashSet::new();
        for s in &cfg.services {
            let key = s.key();
            if !seen.insert(key.clone()) {
                report.errors.push(duplicate(ResourceKind::Service, key, "hostname"));
            } else if self.state.services.get(key.as_str()).is_some_and(|h| h.service() == s) {
                report.count(Change::Unchanged);
            } else {
                report.record(self.upsert_service(s.clone()));
            }
        }
        let mut seen = HashSet::new();
        for w in &cfg.workloads {
            if !seen.insert(w.uid.as_str()) {
                report.errors.push(duplicate(ResourceKind::Workload, w.uid.clone(), "uid"));
            } else if self.state.workloads.get(w.uid.as_str()).is_some_and(|h| h.workload() == w) {
                report.count(Change::Unchanged);
            } else {
                report.record(self.upsert_workload(w.clone()));
            }
        }
        let mut seen = HashSet::new();
        for p in &cfg.policies {
            let key = p.key();
            if !seen.insert(key.clone()) {
                report.errors.push(duplicate(ResourceKind::Policy, key, "name"));
            } else if self.state.policies.get(key.as_str()).is_some_and(|h| **h == *p) {
                report.count(Change::Unchanged);
            } else {
                report.record(self.upsert_policy(p.clone()));
            }
        }
        let mut seen = HashSet::new();
        for p in &cfg.net_policies {
            let key = p.key();
            if !seen.insert(key.clone()) {
                report.errors.push(duplicate(ResourceKind::NetPolicy, key, "name"));
            } else {
                report.record(self.upsert_net_policy(p.clone()));
            }
        }
        report
    }
}

fn duplicate(kind: ResourceKind, name: String, field: &str) -> ResourceError {
    ResourceError { kind, name, field: field.into(), message: "named twice in one configuration; the first is used".into() }
}

/// Adds `name` to the claimants of `at`, as the newest, unless it already
/// claims it (then its claim keeps its age).
fn claim<K: Hash + Eq + Clone>(map: &mut HashMap<K, Claims>, at: K, name: &Arc<str>) {
    let claims = map.entry(at).or_default();
    if !claims.iter().any(|c| c == name) {
        claims.push(name.clone());
    }
}

/// Withdraws `name`'s claim on `at`, and only that.
fn withdraw<K: Hash + Eq + Clone>(map: &mut HashMap<K, Claims>, at: &K, name: &str) {
    if let Some(claims) = map.get_mut(at) {
        claims.retain(|c| &**c != name);
        if claims.is_empty() {
            map.remove(at);
        }
    }
}

fn join(map: &mut HashMap<Arc<str>, OrdSet<Arc<str>>>, set: &str, member: &Arc<str>) {
    match map.get_mut(set) {
        Some(members) => {
            members.insert(member.clone());
        }
        None => {
            map.insert(set.into(), OrdSet::unit(member.clone()));
        }
    }
}

fn leave(map: &mut HashMap<Arc<str>, OrdSet<Arc<str>>>, set: &str, member: &str) {
    if let Some(members) = map.get_mut(set) {
        members.remove(member);
        if members.is_empty() {
            map.remove(set);
        }
    }
}

/// The whole mesh configuration as one document (the state-of-the-world
/// form of the workload API's `Address` resources).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MeshConfig {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    #[serde(default)]
    pub policies: Vec<Authorization>,
    #[serde(default)]
    pub net_policies: Vec<NetPolicy>,
}

impl MeshState {
    /// Builds a snapshot from a whole configuration through a fresh
    /// [`MeshIndex`], returning the resources it refused. A convenience for
    /// tests and one-shot tools; a long-lived source keeps its index.
    pub fn from_config(cfg: &MeshConfig) -> (Arc<MeshState>, Vec<ResourceError>) {
        let mut index = MeshIndex::default();
        let report = index.apply_config(cfg);
        (index.snapshot(), report.errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::policy::Scope;
    use crate::state::Destination;
    use crate::workload::{NetworkAddress, Port, WorkloadStatus, ROOT_NAMESPACE};

    /// A table row: what is wrong, how to spoil a valid resource so, and
    /// the field the refusal must name.
    type Row<T, F> = (&'static str, fn(&mut T), F);

    fn index_with(w: &[Workload], s: &[Service], p: &[Authorization]) -> MeshIndex {
        let mut ix = MeshIndex::default();
        let report =
            ix.apply_config(&MeshConfig { workloads: w.to_vec(), services: s.to_vec(), policies: p.to_vec(), net_policies: vec![] });
        assert_eq!(report.errors, vec![]);
        ix
    }

    #[test]
    fn a_workload_without_an_address_leaves_the_data_path_until_its_node_gives_it_one() {
        let mut ix = index_with(&[wl("web", "10.244.1.5")], &[], &[]);
        let uid = uid("web");
        let held = ix.snapshot().workload(&uid).unwrap().workload().clone();
        let bare = Workload { addresses: vec![], ..held.clone() };
        assert_eq!(
            ix.upsert_workload(bare.clone()),
            Ok(Change::Removed),
            "no error: the control plane publishes pods before their address"
        );
        assert!(ix.snapshot().workload(&uid).is_none(), "not on the data path");
        assert_eq!(ix.snapshot().workload_by_ip("10.244.1.5".parse().unwrap()), None);
        assert_eq!(ix.unaddressed(&uid), Some(&bare));
        assert_eq!(ix.fill_address(&uid, "10.244.1.9".parse().unwrap()), Ok(Change::Added));
        let snap = ix.snapshot();
        let w = snap.workload_by_ip("10.244.1.9".parse().unwrap()).expect("named by the address its node gave");
        assert_eq!((w.uid.as_str(), w.addresses.len()), (uid.as_str(), 1));
        assert_eq!(ix.unaddressed(&uid), None);
        assert_eq!(ix.fill_address(&uid, "10.244.1.9".parse().unwrap()), Ok(Change::Absent), "nothing aside any more");
        // The control plane's own version, with its address, replaces it.
        assert_eq!(ix.upsert_workload(held.clone()), Ok(Change::Updated));
        assert!(ix.snapshot().workload_by_ip("10.244.1.9".parse().unwrap()).is_none());
        // Set aside, then deleted: gone from both.
        assert_eq!(ix.upsert_workload(bare), Ok(Change::Removed));
        assert_eq!(ix.remove_workload(&uid), Change::Unchanged);
        assert_eq!(ix.unaddressed(&uid), None);
        assert_eq!(ix.remove_workload(&uid), Change::Absent);
        // A bad one (its identity) is refused as any version would be, and
        // the one held stays.
        assert_eq!(ix.upsert_workload(held.clone()), Ok(Change::Added));
        let bad = Workload { addresses: vec![], service_account: "a?b".into(), ..held.clone() };
        assert_eq!(ix.upsert_workload(bad).unwrap_err().field, "service_account");
        assert_eq!(ix.unaddressed(&uid), None);
        assert!(ix.snapshot().workload(&uid).is_some(), "the previous version kept");
        // A whole configuration without it forgets it, aside or not.
        assert_eq!(ix.upsert_workload(Workload { addresses: vec![], ..held }), Ok(Change::Removed));
        ix.apply_config(&MeshConfig::default());
        assert_eq!(ix.unaddressed(&uid), None);
    }

    #[test]
    fn refused_workloads_name_the_field_and_keep_the_previous_version() {
        let key = ECHO;
        let field = |s: &str| s.to_string();
        let rows: Vec<Row<Workload, String>> = vec![
            ("no uid", |w| w.uid.clear(), field("uid")),
            ("no namespace", |w| w.namespace.clear(), field("namespace")),
            ("namespace not a SPIFFE segment", |w| w.namespace = "de fault".into(), field("namespace")),
            ("trust domain not a SPIFFE segment", |w| w.trust_domain = "cluster/local".into(), field("trust_domain")),
            ("service account not a SPIFFE segment", |w| w.service_account = "a?b".into(), field("service_account")),
            (
                "service key without namespace",
                |w| {
                    w.services.insert("echo.default.svc.cluster.local".into(), vec![]);
                },
                field("services[\"echo.default.svc.cluster.local\"]"),
            ),
            (
                "service key with an empty hostname",
                |w| {
                    w.services.insert("default/".into(), vec![]);
                },
                field("services[\"default/\"]"),
            ),
            (
                "service port 0",
                |w| {
                    w.services.insert(
                        ECHO.into(),
                        vec![
                            Port { service_port: 80, target_port: 8080, app_protocol: Default::default() },
                            Port { service_port: 0, target_port: 1, app_protocol: Default::default() },
                        ],
                    );
                },
                format!("services[{key:?}][1].service_port"),
            ),
        ];
        let held = member(wl("a", "10.0.0.1"), ECHO, 80, 8080);
        for (what, spoil, want) in rows {
            let mut ix = index_with(std::slice::from_ref(&held), &[], &[]);
            let mut bad = held.clone();
            bad.capacity = 7; // so that it differs even where the spoiling does not
            spoil(&mut bad);
            let e = ix.upsert_workload(bad).expect_err(what);
            assert_eq!((e.kind, e.field.as_str()), (ResourceKind::Workload, want.as_str()), "{what}: {e}");
            assert!(e.to_string().starts_with(&format!("workload {}: {want}: ", e.name)), "{what}: {e}");
            let s = ix.snapshot();
            s.assert_consistent();
            assert_eq!(*s.workload(&uid("a")).unwrap().workload(), held, "{what}: the previous version stays");
            assert_eq!(s.workload_by_ip(ip("10.0.0.1")).unwrap().uid, uid("a"), "{what}");
            assert_eq!(s.counts(), (1, 0, 0), "{what}");
        }
        let mut no_uid = wl("a", "10.0.0.1");
        no_uid.uid.clear();
        assert_eq!(MeshIndex::default().upsert_workload(no_uid).unwrap_err().name, "default/a", "found by namespace/name");
    }

    #[test]
    fn unresolved_target_port_is_allowed() {
        let mut ix = MeshIndex::default();
        assert_eq!(ix.upsert_workload(member(wl("a", "10.0.0.1"), ECHO, 80, 0)), Ok(Change::Added));
        let mut s = svc("echo", "default", "10.96.0.10");
        s.ports[0].target_port = 0;
        assert_eq!(ix.upsert_service(s), Ok(Change::Added));
        let st = ix.snapshot();
        assert!(st.endpoints(&st.service(ECHO).unwrap(), 80).is_empty(), "but never an endpoint");
    }

    #[test]
    fn refused_services_name_the_field_and_keep_the_previous_version() {
        let rows: Vec<Row<Service, &str>> = vec![
            ("no namespace", |s| s.namespace.clear(), "namespace"),
            ("no hostname", |s| s.hostname.clear(), "hostname"),
            (
                "service port 0",
                |s| s.ports.push(Port { service_port: 0, target_port: 80, app_protocol: Default::default() }),
                "ports[1].service_port",
            ),
            (
                "same service port twice",
                |s| s.ports.push(Port { service_port: 80, target_port: 9090, app_protocol: Default::default() }),
                "ports[1].service_port",
            ),
            (
                "SAN not a SPIFFE ID",
                |s| s.subject_alt_names = vec!["spiffe://cluster.local/ns/default/sa/ok".into(), "echo.default".into()],
                "subject_alt_names[1]",
            ),
        ];
        let held = svc("echo", "default", "10.96.0.10");
        for (what, spoil, want) in rows {
            let mut ix = index_with(&[], std::slice::from_ref(&held), &[]);
            let mut bad = held.clone();
            bad.addresses.push(NetworkAddress { network: String::new(), address: ip("10.96.0.11") });
            spoil(&mut bad);
            let name = bad.key();
            let e = ix.upsert_service(bad).expect_err(what);
            assert_eq!((e.kind, e.name.as_str(), e.field.as_str()), (ResourceKind::Service, name.as_str(), want), "{what}: {e}");
            let s = ix.snapshot();
            s.assert_consistent();
            assert_eq!(*s.service(ECHO).unwrap().service(), held, "{what}: the previous version stays");
            assert!(matches!(s.destination(ip("10.96.0.11")), Destination::Unknown), "{what}");
        }
        let mut dup = held.clone();
        dup.ports.push(Port { service_port: 80, target_port: 9090, app_protocol: Default::default() });
        assert_eq!(MeshIndex::default().upsert_service(dup).unwrap_err().message, "80 is also ports[0]'s");
    }

    #[test]
    fn refused_policies_name_the_field() {
        for (p, want) in [(policy("default", "", Scope::Namespace), "name"), (policy("", "p", Scope::Namespace), "namespace")] {
            let mut ix = MeshIndex::default();
            let e = ix.upsert_policy(p).unwrap_err();
            assert_eq!((e.kind, e.field.as_str()), (ResourceKind::Policy, want));
            assert_eq!(ix.snapshot().counts(), (0, 0, 0));
        }
    }

    fn owner(s: &MeshState, addr: &str) -> Option<String> {
        s.workload_by_ip(ip(addr)).map(|w| w.name.clone())
    }

    #[test]
    fn an_address_belongs_to_its_latest_claim() {
        let x = "10.0.0.1";
        let mut ix = MeshIndex::default();
        let a = wl("a", x);
        let b = wl("b", x);
        let mut a2 = a.clone();
        a2.capacity = 2;
        let mut b_elsewhere = b.clone();
        b_elsewhere.addresses = vec![ip("10.0.0.2")];
        // (step, change, owner of x afterwards)
        type Step = Box<dyn Fn(&mut MeshIndex) -> Change>;
        let steps: Vec<(&str, Step, Change, Option<&str>)> = vec![
            ("a claims x", Box::new(move |ix| ix.upsert_workload(a.clone()).unwrap()), Change::Added, Some("a")),
            ("b claims x too: newest claim wins", Box::new(move |ix| ix.upsert_workload(b.clone()).unwrap()), Change::Added, Some("b")),
            ("an update of a keeps its old claim", Box::new(move |ix| ix.upsert_workload(a2.clone()).unwrap()), Change::Updated, Some("b")),
            ("b leaves: back to a, which still lists x", Box::new(|ix| ix.remove_workload(&uid("b"))), Change::Removed, Some("a")),
            ("b again", Box::new(|ix| ix.upsert_workload(wl("b", "10.0.0.1")).unwrap()), Change::Added, Some("b")),
            ("removing the older one leaves the newer", Box::new(|ix| ix.remove_workload(&uid("a"))), Change::Removed, Some("b")),
            ("b moves", Box::new(move |ix| ix.upsert_workload(b_elsewhere.clone()).unwrap()), Change::Updated, None),
            ("removing what is not there", Box::new(|ix| ix.remove_workload(&uid("a"))), Change::Absent, None),
        ];
        for (what, step, change, want) in steps {
            assert_eq!(step(&mut ix), change, "{what}");
            let s = ix.snapshot();
            s.assert_consistent();
            assert_eq!(owner(&s, x).as_deref(), want, "{what}");
        }
        let s = ix.snapshot();
        assert_eq!(owner(&s, "10.0.0.2").as_deref(), Some("b"));
        ix.remove_workload(&uid("b"));
        assert!(ix.snapshot().by_address.is_empty(), "no entry left behind");
    }

    #[test]
    fn vips_and_hostnames_follow_their_services() {
        let mut ix = MeshIndex::default();
        let echo = svc("echo", "default", "10.96.0.10");
        let other = svc("echo", "other", "10.96.0.10");
        ix.upsert_service(echo.clone()).unwrap();
        ix.upsert_service(other.clone()).unwrap();
        ix.upsert_workload(wl("a", "10.96.0.10")).unwrap();
        let s = ix.snapshot();
        s.assert_consistent();
        assert!(
            matches!(s.destination(ip("10.96.0.10")), Destination::Service(v) if v.key() == "other/echo.other.svc.cluster.local"),
            "VIP first, newest claim"
        );
        assert_eq!(s.service_by_hostname("echo.default.svc.cluster.local").unwrap().key(), ECHO, "any namespace");

        ix.remove_service("other/echo.other.svc.cluster.local");
        let s = ix.snapshot();
        assert!(matches!(s.destination(ip("10.96.0.10")), Destination::Service(v) if v.key() == ECHO));
        let mut moved = echo.clone();
        moved.addresses[0].address = ip("10.96.0.20");
        assert_eq!(ix.upsert_service(moved), Ok(Change::Updated));
        let s = ix.snapshot();
        s.assert_consistent();
        assert!(matches!(s.destination(ip("10.96.0.10")), Destination::Workload(w) if w.name == "a"), "then the workload address");
        assert!(matches!(s.destination(ip("10.96.0.20")), Destination::Service(_)));
        assert_eq!(ix.remove_service(ECHO), Change::Removed);
        assert_eq!(ix.remove_service(ECHO), Change::Absent);
        let s = ix.snapshot();
        s.assert_consistent();
        assert!(s.service_by_hostname("echo.default.svc.cluster.local").is_none());
        assert!(s.by_vip.is_empty() && s.by_hostname.is_empty());
    }

    fn endpoint_names(s: &MeshState, key: &str, port: u16) -> Vec<(String, u16)> {
        match s.service(key) {
            Some(svc) => s.endpoints(&svc, port).iter().map(|e| (e.workload.name.clone(), e.target_port)).collect(),
            None => vec![],
        }
    }

    #[test]
    fn membership_belongs_to_the_workloads() {
        let mut ix = MeshIndex::default();
        // The workload names the service before the service exists.
        ix.upsert_workload(member(wl("a", "10.0.0.1"), ECHO, 80, 9000)).unwrap();
        ix.upsert_workload(member(wl("b", "10.0.0.2"), ECHO, 80, 9001)).unwrap();
        ix.upsert_service(svc("echo", "default", "10.96.0.10")).unwrap();
        let s = ix.snapshot();
        s.assert_consistent();
        assert_eq!(endpoint_names(&s, ECHO, 80), [("a".into(), 9000), ("b".into(), 9001)]);

        // Removed and added again: the members are where they were.
        ix.remove_service(ECHO);
        let s = ix.snapshot();
        s.assert_consistent();
        assert!(s.service(ECHO).is_none());
        ix.upsert_service(svc("echo", "default", "10.96.0.10")).unwrap();
        assert_eq!(endpoint_names(&ix.snapshot(), ECHO, 80), [("a".into(), 9000), ("b".into(), 9001)]);

        // A member that turns unhealthy stays a member but is no endpoint.
        let mut b = member(wl("b", "10.0.0.2"), ECHO, 80, 9001);
        b.status = WorkloadStatus::Unhealthy;
        ix.upsert_workload(b).unwrap();
        assert_eq!(endpoint_names(&ix.snapshot(), ECHO, 80), [("a".into(), 9000)]);

        // A workload that stops naming the service leaves it.
        let mut a = wl("a", "10.0.0.1");
        a.services.insert("default/other.default.svc.cluster.local".into(), vec![]);
        ix.upsert_workload(a).unwrap();
        let s = ix.snapshot();
        s.assert_consistent();
        assert!(endpoint_names(&s, ECHO, 80).is_empty());
        ix.remove_workload(&uid("a"));
        ix.remove_workload(&uid("b"));
        assert!(ix.snapshot().members.is_empty(), "no entry left behind");
    }

    #[test]
    fn policies_of_a_workload_through_the_namespace_index() {
        let mut in_ns1 = wl("a", "10.0.0.1");
        in_ns1.namespace = "ns1".into();
        in_ns1.authorization_policies = vec!["ns2/selected".into(), "ns1/p".into(), "ns2/missing".into()];
        let mut in_ns2 = wl("b", "10.0.0.2");
        in_ns2.namespace = "ns2".into();
        let policies = [
            policy(ROOT_NAMESPACE, "global", Scope::Global),
            policy("ns1", "global-elsewhere", Scope::Global),
            policy("ns1", "p", Scope::Namespace),
            policy("ns2", "selected", Scope::WorkloadSelector),
            policy("ns2", "unlisted", Scope::WorkloadSelector),
        ];
        let mut ix = index_with(&[in_ns1, in_ns2], &[], &policies);
        let keys = |ix: &MeshIndex, name: &str| -> Vec<String> {
            let s = ix.snapshot();
            s.assert_consistent();
            let w = s.workload(&format!("c//Pod/default/{name}")).unwrap();
            s.policies_for(&w).iter().map(|p| p.key()).collect()
        };
        assert_eq!(keys(&ix, "a"), [format!("{ROOT_NAMESPACE}/global"), "ns1/p".into(), "ns2/selected".into()]);
        assert_eq!(keys(&ix, "b"), [format!("{ROOT_NAMESPACE}/global")]);

        // The policy moves from ns1 to ns2 (a removal and an upsert).
        assert_eq!(ix.remove_policy("ns1/p"), Change::Removed);
        assert_eq!(ix.upsert_policy(policy("ns2", "p", Scope::Namespace)), Ok(Change::Added));
        assert_eq!(keys(&ix, "a"), [format!("{ROOT_NAMESPACE}/global"), "ns2/selected".into()]);
        assert_eq!(keys(&ix, "b"), [format!("{ROOT_NAMESPACE}/global"), "ns2/p".into()]);
        assert!(ix.snapshot().policies_by_namespace.get("ns1").unwrap().contains("ns1/global-elsewhere"));
        assert_eq!(ix.remove_policy("ns1/global-elsewhere"), Change::Removed);
        assert!(ix.snapshot().policies_by_namespace.get("ns1").is_none(), "no entry left behind");
    }

    #[test]
    fn apply_config_applies_the_difference() {
        let echo = svc("echo", "default", "10.96.0.10");
        let allow = policy("default", "allow", Scope::Namespace);
        let v1 = MeshConfig {
            workloads: vec![member(wl("a", "10.0.0.1"), ECHO, 80, 8080), wl("b", "10.0.0.2")],
            services: vec![echo.clone()],
            policies: vec![allow.clone()],
            net_policies: vec![],
        };
        let mut ix = MeshIndex::default();
        let r = ix.apply_config(&v1);
        assert_eq!((r.added, r.updated, r.removed, r.unchanged, r.errors.len()), (4, 0, 0, 0, 0));
        assert!(r.changed());
        let before = ix.snapshot();

        let r = ix.apply_config(&v1);
        assert_eq!((r.added, r.updated, r.removed, r.unchanged, r.errors.len()), (0, 0, 0, 4, 0), "the same config twice");
        assert!(!r.changed());
        assert_eq!(r.to_string(), "0 added, 0 updated, 0 removed, 4 unchanged, 0 refused");

        // a changes, b goes, c comes, the service stays, the policy goes.
        let mut a = v1.workloads[0].clone();
        a.capacity = 5;
        let v2 = MeshConfig {
            workloads: vec![a.clone(), wl("c", "10.0.0.3")],
            services: vec![echo.clone()],
            policies: vec![],
            net_policies: vec![],
        };
        let r = ix.apply_config(&v2);
        assert_eq!((r.added, r.updated, r.removed, r.unchanged, r.errors.len()), (1, 1, 2, 1, 0));
        let s = ix.snapshot();
        s.assert_consistent();
        assert_eq!(s.counts(), (2, 1, 0));
        assert_eq!(s.workload(&uid("a")).unwrap().capacity, 5);
        assert!(s.workload_by_ip(ip("10.0.0.2")).is_none());
        assert!(Arc::ptr_eq(&s.service(ECHO).unwrap(), &before.service(ECHO).unwrap()), "an unchanged resource is not rebuilt");

        // A bad version of a held resource is refused and the held one
        // stays (and is not removed for being "absent"); a bad new one is
        // not added; a name given twice keeps the first.
        let mut bad_a = a.clone();
        bad_a.service_account = "a?b".into();
        let mut bad_d = wl("d", "10.0.0.4");
        bad_d.service_account = "x y".into();
        let mut c2 = wl("c", "10.0.0.33");
        c2.capacity = 9;
        let v3 = MeshConfig {
            workloads: vec![bad_a, bad_d, wl("c", "10.0.0.3"), c2],
            services: vec![echo.clone()],
            policies: vec![],
            net_policies: vec![],
        };
        let r = ix.apply_config(&v3);
        assert_eq!((r.added, r.updated, r.removed, r.unchanged), (0, 0, 0, 2));
        let refused: Vec<(ResourceKind, &str, &str)> = r.errors.iter().map(|e| (e.kind, e.name.as_str(), e.field.as_str())).collect();
        let (ua, ud, uc) = (uid("a"), uid("d"), uid("c"));
        assert_eq!(
            refused,
            [
                (ResourceKind::Workload, ua.as_str(), "service_account"),
                (ResourceKind::Workload, ud.as_str(), "service_account"),
                (ResourceKind::Workload, uc.as_str(), "uid")
            ]
        );
        let s = ix.snapshot();
        s.assert_consistent();
        assert_eq!(*s.workload(&uid("a")).unwrap().workload(), a);
        assert!(s.workload(&uid("d")).is_none());
        assert_eq!(s.workload(&uid("c")).unwrap().address(), ip("10.0.0.3"));

        // Everything goes.
        let r = ix.apply_config(&MeshConfig::default());
        assert_eq!((r.added, r.updated, r.removed, r.unchanged), (0, 0, 3, 0));
        let s = ix.snapshot();
        s.assert_consistent();
        assert_eq!(s.counts(), (0, 0, 0));
        assert!(s.members.is_empty() && s.by_address.is_empty() && s.by_vip.is_empty() && s.by_hostname.is_empty());
    }

    #[test]
    fn a_snapshot_does_not_see_later_changes() {
        let mut ix = index_with(&[wl("a", "10.0.0.1")], &[svc("echo", "default", "10.96.0.10")], &[]);
        let before = ix.snapshot();
        ix.upsert_workload(member(wl("b", "10.0.0.2"), ECHO, 80, 8080)).unwrap();
        ix.remove_workload(&uid("a"));
        ix.upsert_policy(policy("default", "p", Scope::Namespace)).unwrap();
        let after = ix.snapshot();
        assert!(before.workload_by_ip(ip("10.0.0.2")).is_none());
        assert_eq!(before.workload_by_ip(ip("10.0.0.1")).unwrap().name, "a");
        assert!(before.endpoints(&before.service(ECHO).unwrap(), 80).is_empty());
        assert_eq!(before.counts(), (1, 1, 0));
        assert_eq!(after.counts(), (1, 1, 1));
        assert_eq!(after.endpoints(&after.service(ECHO).unwrap(), 80).len(), 1);
        before.assert_consistent();
        after.assert_consistent();
    }

    #[test]
    fn an_identical_upsert_changes_nothing() {
        let mut ix = MeshIndex::default();
        let w = wl("a", "10.0.0.1");
        assert_eq!(ix.upsert_workload(w.clone()), Ok(Change::Added));
        let s = ix.snapshot();
        assert_eq!(ix.upsert_workload(w), Ok(Change::Unchanged));
        assert!(Arc::ptr_eq(&s.workload(&uid("a")).unwrap(), &ix.snapshot().workload(&uid("a")).unwrap()));
        assert_eq!(ix.upsert_service(svc("e", "default", "10.96.0.1")), Ok(Change::Added));
        assert_eq!(ix.upsert_service(svc("e", "default", "10.96.0.1")), Ok(Change::Unchanged));
        assert_eq!(ix.upsert_policy(policy("default", "p", Scope::Global)), Ok(Change::Added));
        assert_eq!(ix.upsert_policy(policy("default", "p", Scope::Global)), Ok(Change::Unchanged));
        assert_eq!(ix.upsert_policy(policy("default", "p", Scope::Namespace)), Ok(Change::Updated));
        assert_eq!(ix.remove_policy("default/p"), Change::Removed);
        assert!(Change::Removed.changed() && !Change::Absent.changed() && !Change::Unchanged.changed());
    }
}
