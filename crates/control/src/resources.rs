//! What the control plane publishes: every resource of the workload API,
//! encoded once and shared by every proxy's stream.
//!
//! The contract between the index (objects in, resources out) and the xDS
//! server (resources in, deltas out) is this module's types: the index
//! upserts and removes [`Versioned`] resources by [`ResourceKey`]; the
//! server compares the versions a proxy holds with these.

use slipstream_api::TypeUrl;
use std::sync::Arc;

/// A resource's identity: its type and its name in the workload API
/// (workload: uid; service: `namespace/hostname`; authorization:
/// `namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub type_url: TypeUrl,
    pub name: Arc<str>,
}

impl ResourceKey {
    pub fn new(type_url: TypeUrl, name: &str) -> Self {
        ResourceKey { type_url, name: name.into() }
    }
}

impl std::fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.type_url, self.name)
    }
}

/// One resource as it goes on the wire, with what the control plane itself
/// needs to know of it without decoding it again.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// A hash of the encoded resource: the same content has the same
    /// version on every replica and across restarts, so a proxy that
    /// reconnects (to this replica or another) is sent only what differs.
    pub version: Arc<str>,
    pub body: prost_types::Any,
    /// The `Resource` message that carries it, less its name: version and
    /// body, encoded once here and copied as they are into every response
    /// that sends it (`xds::wire`).
    pub encoded: prost::bytes::Bytes,
    /// Workloads: the node the pod runs on, and its SPIFFE ID (the CA signs
    /// an identity only for a caller on that node).
    pub node: Option<Arc<str>>,
    pub identity: Option<Arc<str>>,
}

impl Versioned {
    pub fn new(body: prost_types::Any) -> Self {
        let version: Arc<str> = version_of(&body.value).into();
        let encoded = prost::Message::encode_to_vec(&slipstream_api::discovery::Resource {
            version: version.to_string(),
            resource: Some(body.clone()),
            ..Default::default()
        })
        .into();
        Versioned { version, body, encoded, node: None, identity: None }
    }
}

/// FNV-1a (64-bit) of the encoded bytes, in hex. Encoding is deterministic
/// (map fields are ordered), so equal resources have equal versions.
pub fn version_of(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Every resource at one moment: a persistent map, so cloning it is O(1)
/// and consecutive snapshots share what did not change.
pub type Resources = imbl::OrdMap<ResourceKey, Arc<Versioned>>;

/// What one change to the objects did to the resources.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    pub upserted: Vec<ResourceKey>,
    pub removed: Vec<ResourceKey>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.upserted.is_empty() && self.removed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_content() {
        assert_eq!(version_of(b"abc"), version_of(b"abc"));
        assert_ne!(version_of(b"abc"), version_of(b"abd"));
        assert_eq!(version_of(b"").len(), 16);
    }
}
