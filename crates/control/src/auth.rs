//! Who is calling: every xDS stream and every certificate request carries
//! `authorization: Bearer <token>` (shared/PROTOCOLS.md sections 3 and 4),
//! and the answer to "which node is this caller the proxy of" decides what
//! it may obtain. One trait, two kinds of credential: the local cluster's
//! per-node tokens ([`NodeTokens`]), and in Kubernetes ServiceAccount
//! tokens checked with TokenReview.

mod gate;

pub use gate::{Gate, GateSettings};

use futures_util::future::BoxFuture;
use std::collections::BTreeMap;
use std::path::Path;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The node whose proxy this is: the CA signs only identities of pods
    /// on it, and its xDS node metadata must name it.
    pub node: String,
    /// Who, for logs (`node-token:node1`, `system:serviceaccount:istio-system:ztunnel`).
    pub subject: String,
}

/// Why a caller was not let in. Messages never echo the credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no `authorization: Bearer <token>` metadata")]
    Missing,
    #[error("malformed authorization metadata: {0}")]
    Malformed(&'static str),
    #[error("the token was refused: {0}")]
    Rejected(String),
    /// The authority that checks tokens could not be asked (TokenReview
    /// unreachable): the caller may retry.
    #[error("the token could not be checked: {0}")]
    Unavailable(String),
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unavailable(_) => tonic::Status::unavailable(e.to_string()),
            _ => tonic::Status::unauthenticated(e.to_string()),
        }
    }
}

/// Checks a call's credentials.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>>;
}

/// The bearer token of a call.
pub fn bearer(md: &tonic::metadata::MetadataMap) -> Result<&str, AuthError> {
    let v = md.get("authorization").ok_or(AuthError::Missing)?;
    let v = v.to_str().map_err(|_| AuthError::Malformed("not ASCII"))?;
    let token = v.strip_prefix("Bearer ").ok_or(AuthError::Malformed("expected `Bearer <token>`"))?.trim();
    if token.is_empty() {
        return Err(AuthError::Malformed("empty token"));
    }
    Ok(token)
}

/// The local cluster's credentials: one random token per node, created by
/// `slipstream up` and readable only by root. The file maps node names to
/// tokens (JSON object).
#[derive(Clone, Default)]
pub struct NodeTokens {
    by_token: BTreeMap<String, String>,
}

impl std::fmt::Debug for NodeTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the tokens.
        f.debug_struct("NodeTokens").field("nodes", &self.by_token.values().collect::<Vec<_>>()).finish()
    }
}

impl NodeTokens {
    /// From `{"node1": "<token>", ...}`.
    pub fn new(by_node: BTreeMap<String, String>) -> NodeTokens {
        NodeTokens { by_token: by_node.into_iter().map(|(n, t)| (t, n)).collect() }
    }

    pub fn load(path: &Path) -> anyhow::Result<NodeTokens> {
        use anyhow::Context;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the node tokens {}", path.display()))?;
        let by_node: BTreeMap<String, String> =
            serde_json::from_str(&text).with_context(|| format!("{}: expected a JSON object of node name to token", path.display()))?;
        if let Some((n, _)) = by_node.iter().find(|(_, t)| t.len() < 16) {
            anyhow::bail!("{}: the token of node {n} is shorter than 16 characters", path.display());
        }
        Ok(NodeTokens::new(by_node))
    }

    fn check(&self, token: &str) -> Option<&str> {
        // Compare against every token in full, so the time taken does not
        // say how much of a guess was right.
        let mut found = None;
        for (t, node) in &self.by_token {
            if constant_time_eq(t.as_bytes(), token.as_bytes()) {
                found = Some(node.as_str());
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator for NodeTokens {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
        let r = bearer(md).and_then(|t| {
            self.check(t)
                .map(|node| Caller { node: node.to_string(), subject: format!("node-token:{node}") })
                .ok_or_else(|| AuthError::Rejected("not a token of any node of this cluster".into()))
        });
        Box::pin(async move { r })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(v: Option<&str>) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        if let Some(v) = v {
            m.insert("authorization", v.parse().unwrap());
        }
        m
    }

    #[tokio::test]
    async fn node_tokens() {
        let t = NodeTokens::new([("node1".to_string(), "a".repeat(32)), ("node2".to_string(), "b".repeat(32))].into());
        let ok = t.authenticate(&md(Some(&format!("Bearer {}", "b".repeat(32))))).await.unwrap();
        assert_eq!(ok.node, "node2");
        assert_eq!(t.authenticate(&md(None)).await, Err(AuthError::Missing));
        assert!(matches!(t.authenticate(&md(Some("Basic x"))).await, Err(AuthError::Malformed(_))));
        assert!(matches!(t.authenticate(&md(Some("Bearer "))).await, Err(AuthError::Malformed(_))));
        assert!(matches!(t.authenticate(&md(Some(&format!("Bearer {}", "c".repeat(32))))).await, Err(AuthError::Rejected(_))));
        assert!(!format!("{t:?}").contains("aaaa"), "tokens are never printed");
    }
}
