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
//!   on SIGHUP and when the files change; `load` makes it from its texts.
//! - [`secret`]: the CA material from a Kubernetes Secret (Istio's
//!   `cacerts` layout), created with a generated root when absent.
//! - [`root_configmap`]: the roots published in a ConfigMap for the node
//!   proxies.
//! - [`limits`]: per-caller bounds on requests and refusal log lines.
//! - [`tokenreview`]: Kubernetes callers, by TokenReview.
//! - [`args`]: the flags, for `slipstream control`.
//!
//! The signing key never leaves this process: node proxies send CSRs.
//! See docs/control-plane.md, "Certificates".

pub mod args;
pub mod limits;
mod load;
pub mod placement;
pub mod root_configmap;
pub mod roots;
pub mod secret;
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
