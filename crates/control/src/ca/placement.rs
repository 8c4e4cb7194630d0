//! Which identities run on which node: what "a node proxy may obtain only
//! the identities of the pods on its own node" is checked against.
//!
//! The answer comes from the workload resources the control plane
//! publishes (each carries its node and SPIFFE ID, see
//! [`Versioned`](crate::resources::Versioned)), so the CA and the xDS
//! stream agree on where a pod runs by construction.

use crate::resources::Resources;
use slipstream_core::sync::LockExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Where workloads run.
pub trait Placement: Send + Sync + 'static {
    /// Whether at least one workload on `node` runs as `identity`
    /// (`spiffe://...`).
    fn runs_on(&self, node: &str, identity: &str) -> bool;
}

/// The current resources, from whatever holds them (the xDS store, a watch
/// channel, a fixed map in tests).
pub trait ResourceSource: Send + Sync + 'static {
    fn resources(&self) -> Resources;
}

impl ResourceSource for watch::Receiver<Resources> {
    fn resources(&self) -> Resources {
        self.borrow().clone()
    }
}

impl ResourceSource for Resources {
    fn resources(&self) -> Resources {
        self.clone()
    }
}

/// Node to identities, built from one snapshot of the resources.
type Index = HashMap<Arc<str>, HashSet<Arc<str>>>;

/// [`Placement`] over the published workload resources. The node to
/// identities index is rebuilt only when a request finds that the
/// resources changed since the last one (an O(1) pointer comparison of the
/// persistent map), so requests cost a hash lookup however large the mesh.
pub struct ResourcePlacement<S> {
    source: S,
    cache: Mutex<Option<(Resources, Arc<Index>)>>,
}

impl<S: ResourceSource> ResourcePlacement<S> {
    pub fn new(source: S) -> Self {
        ResourcePlacement { source, cache: Mutex::new(None) }
    }

    fn index(&self) -> Arc<Index> {
        let now = self.source.resources();
        let mut cache = self.cache.locked();
        if let Some((seen, index)) = cache.as_ref() {
            if seen.ptr_eq(&now) {
                return index.clone();
            }
        }
        let mut index = Index::new();
        for v in now.values() {
            if let (Some(node), Some(identity)) = (&v.node, &v.identity) {
                index.entry(node.clone()).or_default().insert(identity.clone());
            }
        }
        let index = Arc::new(index);
        *cache = Some((now, index.clone()));
        index
    }
}

impl<S: ResourceSource> Placement for ResourcePlacement<S> {
    fn runs_on(&self, node: &str, identity: &str) -> bool {
        self.index().get(node).is_some_and(|ids| ids.contains(identity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ResourceKey, Versioned};
    use slipstream_api::TypeUrl;

    pub(crate) fn workload(uid: &str, node: &str, identity: &str) -> (ResourceKey, Arc<Versioned>) {
        let mut v = Versioned::new(prost_types::Any { type_url: TypeUrl::Address.as_str().into(), value: uid.as_bytes().to_vec() });
        v.node = Some(node.into());
        v.identity = Some(identity.into());
        (ResourceKey::new(TypeUrl::Address, uid), Arc::new(v))
    }

    #[test]
    fn identities_are_per_node_and_follow_changes() {
        let web = "spiffe://cluster.local/ns/default/sa/web";
        let db = "spiffe://cluster.local/ns/default/sa/db";
        let mut r = Resources::new();
        let (k, v) = workload("c1/Pod/default/web-1", "node1", web);
        r.insert(k, v);
        let (tx, rx) = watch::channel(r.clone());
        let p = ResourcePlacement::new(rx);
        assert!(p.runs_on("node1", web));
        assert!(!p.runs_on("node2", web));
        assert!(!p.runs_on("node1", db));

        // A service (no node, no identity) changes nothing.
        let svc = Versioned::new(prost_types::Any::default());
        r.insert(ResourceKey::new(TypeUrl::Address, "default/web.default.svc.cluster.local"), Arc::new(svc));
        let (k, v) = workload("c1/Pod/default/db-1", "node2", db);
        r.insert(k, v);
        tx.send_replace(r.clone());
        assert!(p.runs_on("node2", db));

        // The pod moves: the old node loses the identity.
        let (k, v) = workload("c1/Pod/default/web-1", "node2", web);
        r.insert(k, v);
        tx.send_replace(r);
        assert!(!p.runs_on("node1", web));
        assert!(p.runs_on("node2", web));
    }
}
