//! Where objects come from. Each source turns what it watches into events
//! for the index: `dir` reads a directory of manifests (the local cluster's
//! agent keeps one), `kube` watches the Kubernetes API.

pub mod dir;
pub mod kube;
