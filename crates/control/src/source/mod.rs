//! Where objects come from. Each source turns what it watches into
//! [`ObjectEvent`](crate::index::ObjectEvent)s for the index; `dir` reads a
//! directory of manifests (the local cluster's agent keeps one).

pub mod dir;
