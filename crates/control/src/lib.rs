//! slipstream-control: the control plane (`slipstream control`).
//!
//! Objects come in from a source (the Kubernetes API, or a directory of
//! manifests that the local cluster's agent keeps), go through one pure
//! index that turns them into the workload API's resources, and go out to
//! every node proxy as deltas over xDS; the certificate service signs
//! workload certificates for the pods of the caller's node. See
//! docs/control-plane.md.
#![forbid(unsafe_code)]

pub mod auth;
pub mod ca;
pub mod gateway;
pub mod index;
pub mod jwks;
pub mod leader;
pub mod monitor;
pub mod namespaced;
pub mod objects;
pub mod peer;
pub mod resources;
pub mod run;
pub mod serve;
pub mod source;
pub mod store;
pub mod syncz;
pub mod translate;
pub mod xds;
