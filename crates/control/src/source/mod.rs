//! Where objects come from. Each source turns what it watches into events
//! for the index: `dir` reads a directory of manifests (the local cluster's
//! agent keeps one), `kube` watches the Kubernetes API.

pub mod dir;
pub mod kube;

use crate::objects::{ClusterObject, ObjectRef};

/// One change of the cluster, as a source reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectEvent {
    Upsert(ClusterObject),
    Delete(ObjectRef),
}

impl ObjectEvent {
    pub fn object_ref(&self) -> ObjectRef {
        match self {
            ObjectEvent::Upsert(o) => o.object_ref(),
            ObjectEvent::Delete(r) => r.clone(),
        }
    }
}
