//! Who is calling: every xDS stream and every certificate request carries
//! `authorization: Bearer <token>` (docs/protocols.md sections 3 and 4),
//! and the answer to "which node is this caller the proxy of" decides what
//! it may obtain. One trait, two kinds of credential: the local cluster's
//! per-node tokens ([`NodeTokens`]), and in Kubernetes ServiceAccount
//! tokens checked with TokenReview.

mod gate;

pub use gate::{Gate, GateSettings};

use futures_util::future::BoxFuture;
use slipstream_core::sync::LockExt;
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
    /// A workload calling for itself (a waypoint): the one identity
    /// (`spiffe://...`) the CA signs for it. None for a node proxy, which
    /// obtains the identities of the pods on its node.
    pub identity: Option<String>,
}

impl Caller {
    /// Whose share of the CA's per-caller bounds a request comes out of:
    /// a node proxy's node, or the one workload pod calling for itself (a
    /// waypoint's `subject` names its pod), so a waypoint pod at its bound
    /// never delays the certificates its node's proxy asks for.
    pub fn budget(&self) -> String {
        match &self.identity {
            None => format!("node:{}", self.node),
            Some(_) => format!("workload:{}", self.subject),
        }
    }
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

/// The local cluster's workload credentials: one random token per
/// waypoint pod, written by the agent (which plays the kubelet that would
/// project a ServiceAccount token) into a file only root reads, and read
/// again whenever the file changes, as pods come and go. The file maps
/// tokens to `{namespace, service_account, node, pod}`.
pub struct WorkloadTokens {
    path: std::path::PathBuf,
    trust_domain: String,
    cache: std::sync::Mutex<(Option<std::time::SystemTime>, BTreeMap<String, WorkloadEntry>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct WorkloadEntry {
    pub namespace: String,
    pub service_account: String,
    pub node: String,
    pub pod: String,
}

impl WorkloadTokens {
    pub fn new(path: &Path, trust_domain: &str) -> WorkloadTokens {
        WorkloadTokens { path: path.to_path_buf(), trust_domain: trust_domain.to_string(), cache: Default::default() }
    }

    fn check(&self, token: &str) -> Option<WorkloadEntry> {
        let mut cache = self.cache.locked();
        let modified = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if modified != cache.0 {
            let read: BTreeMap<String, WorkloadEntry> = match std::fs::read_to_string(&self.path) {
                Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                    tracing::warn!(path = %self.path.display(), "workload tokens unreadable, none accepted: {e}");
                    BTreeMap::new()
                }),
                Err(_) => BTreeMap::new(),
            };
            *cache = (modified, read.into_iter().filter(|(t, _)| t.len() >= 16).collect());
        }
        let mut found = None;
        for (t, e) in &cache.1 {
            if constant_time_eq(t.as_bytes(), token.as_bytes()) {
                found = Some(e.clone());
            }
        }
        found
    }
}

/// Node tokens first, then workload tokens.
pub struct LocalTokens {
    pub nodes: NodeTokens,
    pub workloads: Option<WorkloadTokens>,
}

impl Authenticator for LocalTokens {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
        let r = bearer(md).and_then(|t| {
            if let Some(node) = self.nodes.check(t) {
                return Ok(Caller { node: node.to_string(), subject: format!("node-token:{node}"), identity: None });
            }
            let w = self.workloads.as_ref().and_then(|w| Some((w.check(t)?, &w.trust_domain)));
            match w {
                Some((e, td)) => Ok(Caller {
                    node: e.node.clone(),
                    subject: format!("workload-token:{}/{}", e.namespace, e.pod),
                    identity: Some(format!("spiffe://{td}/ns/{}/sa/{}", e.namespace, e.service_account)),
                }),
                None => Err(AuthError::Rejected("not a token of any node or workload of this cluster".into())),
            }
        });
        Box::pin(async move { r })
    }
}

impl Authenticator for NodeTokens {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
        let r = bearer(md).and_then(|t| {
            self.check(t)
                .map(|node| Caller { node: node.to_string(), subject: format!("node-token:{node}"), identity: None })
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
