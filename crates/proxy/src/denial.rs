//! A policy's refusal, as the authorization seam ([`crate::authz`]) gives
//! it to both proxies: the node proxy's `ProxyError::Denied` carries it
//! (and its denial metric is labelled from it), the waypoint refuses a
//! request or connection with its text.

use std::sync::Arc;

/// A policy's refusal: its text (for logs and the HBONE answer), the layer
/// and the policy and rule that decided, for the denial metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `network policy: denied by NetworkPolicy ns/name spec.ingress[0]`.
    pub text: Arc<str>,
    /// `network_policy` or `authorization`.
    pub layer: &'static str,
    /// The deciding policy: the rule that denied, or the first policy
    /// that required an allow; None when no policy decided (a destination
    /// unknown to the mesh configuration).
    pub by: Option<slipstream_core::policy::PolicyRule>,
}

impl Denial {
    pub fn other(text: impl Into<Arc<str>>) -> Arc<Denial> {
        Arc::new(Denial { text: text.into(), layer: "authorization", by: None })
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}
