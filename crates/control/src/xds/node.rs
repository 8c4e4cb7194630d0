//! Who a stream claims to be: the `node` of its first request, checked
//! against who authenticated.
//!
//! ztunnel's node id is `ztunnel~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local`
//! and its metadata carries `NODE_NAME`. The id is shown, never trusted:
//! any id is accepted. `NODE_NAME` is required and must be the node the
//! credentials belong to, so one node's proxy cannot pass for another's.

use crate::auth::Caller;
use slipstream_api::discovery::DeltaDiscoveryRequest;
use slipstream_api::{struct_string, NODE_NAME};

/// The proxy at the other end of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNode {
    /// NODE_NAME.
    pub node: String,
    /// The node id as sent.
    pub id: String,
}

/// Why a first request was refused: the gRPC status it ends the stream with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("the first request of a stream must carry `node`")]
    NoNode,
    #[error("the node metadata has no NODE_NAME (node id {id:?})")]
    NoNodeName { id: String },
    #[error("{subject} may act only for node {authenticated}, but its node metadata says NODE_NAME={claimed}")]
    OtherNode { subject: String, authenticated: String, claimed: String },
}

impl From<NodeError> for tonic::Status {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::OtherNode { .. } => tonic::Status::permission_denied(e.to_string()),
            _ => tonic::Status::invalid_argument(e.to_string()),
        }
    }
}

pub fn check(first: &DeltaDiscoveryRequest, caller: &Caller) -> Result<ProxyNode, NodeError> {
    let node = first.node.as_ref().ok_or(NodeError::NoNode)?;
    let name = struct_string(node.metadata.as_ref(), NODE_NAME)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| NodeError::NoNodeName { id: node.id.clone() })?;
    if name != caller.node {
        return Err(NodeError::OtherNode {
            subject: caller.subject.clone(),
            authenticated: caller.node.clone(),
            claimed: name.to_string(),
        });
    }
    Ok(ProxyNode { node: name.to_string(), id: node.id.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_api::discovery::Node;
    use slipstream_api::string_struct;

    fn req(node: Option<Node>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest { node, ..Default::default() }
    }

    fn node(id: &str, meta: &[(&str, &str)]) -> Option<Node> {
        Some(Node { id: id.into(), metadata: Some(string_struct(meta.iter().copied())), ..Default::default() })
    }

    #[test]
    fn node_name_must_be_the_callers() {
        let caller = Caller { node: "node1".into(), subject: "node-token:node1".into(), identity: None };
        let id = "ztunnel~10.0.0.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local";
        assert_eq!(check(&req(node(id, &[(NODE_NAME, "node1")])), &caller), Ok(ProxyNode { node: "node1".into(), id: id.into() }));
        // Liberal about the id.
        assert!(check(&req(node("anything", &[(NODE_NAME, "node1")])), &caller).is_ok());
        assert_eq!(check(&req(None), &caller), Err(NodeError::NoNode));
        assert!(matches!(check(&req(node(id, &[])), &caller), Err(NodeError::NoNodeName { .. })));
        assert!(matches!(check(&req(node(id, &[(NODE_NAME, "")])), &caller), Err(NodeError::NoNodeName { .. })));
        let e = check(&req(node(id, &[(NODE_NAME, "node2")])), &caller).unwrap_err();
        assert_eq!(e.to_string(), "node-token:node1 may act only for node node1, but its node metadata says NODE_NAME=node2");
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::PermissionDenied);
    }
}
