//! The certificate authority: `istio.v1.auth.IstioCertificateService` on
//! the control plane's port (docs/protocols.md section 3).
//!
//! - [`service`]: the RPC. Who calls ([`crate::auth`]), what the CSR asks
//!   for, whether a pod of the caller's node runs as that identity, then
//!   the signature; refusals with their gRPC code and a message that names
//!   the problem.
//! - [`placement`]: which identities run on which node, from the workload
//!   resources the control plane publishes.
//! - [`roots`]: the CA material (operator's files or generated), reloaded
//!   on SIGHUP and when the files change.
//! - [`limits`]: per-caller bounds on requests and refusal log lines.
//! - [`tokenreview`]: Kubernetes callers, by TokenReview.
//! - [`args`]: the flags, for `slipstream control`.
//!
//! The signing key never leaves this process: node proxies send CSRs.
//! See docs/control-plane.md, "Certificates".

pub mod args;
pub mod limits;
pub mod placement;
pub mod roots;
pub mod service;
pub mod testing;
pub mod tokenreview;

pub use args::CaArgs;
pub use limits::{CallerLimits, Rate};
pub use placement::{Placement, ResourcePlacement, ResourceSource};
pub use roots::{CaFiles, CaMaterial, CaSource};
pub use service::{CaConfig, CaService, Refusal};
pub use tokenreview::{ReviewPolicy, TokenReviewAuthenticator};

#[cfg(test)]
mod tests;
