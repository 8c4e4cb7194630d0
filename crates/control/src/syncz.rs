//! `/debug/syncz`: what each connected proxy was sent and acknowledged, the
//! stable shape `slipstream proxy-status` and `slipstream apply` read (as
//! istiod's `/debug/syncz` feeds `istioctl proxy-status`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Syncz {
    /// This replica's name (its host name).
    pub replica: String,
    /// The newest objects generation the source has taken in (local
    /// cluster: the counter the agent writes with the objects; 0 when the
    /// source has none).
    pub objects_generation: u64,
    /// The resources' generation those objects produced: a proxy that
    /// acknowledged it holds everything up to them.
    pub generation: u64,
    /// Resources published, by type.
    pub resources: std::collections::BTreeMap<String, usize>,
    pub proxies: Vec<ProxySync>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxySync {
    /// NODE_NAME of the proxy's metadata.
    pub node: String,
    /// Its xDS node id (`ztunnel~10.0.0.1~ztunnel-x.istio-system~...`).
    pub id: String,
    /// Who authenticated (`node-token:node1`).
    pub caller: String,
    pub peer: String,
    pub connected_secs: u64,
    /// The newest generation every type of this proxy acknowledged.
    pub acked_generation: u64,
    pub types: Vec<TypeSync>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TypeSync {
    /// `Address`, `Authorization`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Nonce of the last response sent, and of the last one acknowledged.
    pub sent_nonce: String,
    pub acked_nonce: String,
    /// Resources the proxy holds (as far as the server knows).
    pub resources: usize,
    pub nacks: u64,
    /// The reason the proxy gave for its last NACK.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_nack: String,
    /// The generation of the response it refused last (0: none).
    #[serde(default)]
    pub last_nack_generation: u64,
    /// Everything sent was acknowledged.
    pub in_sync: bool,
}

impl ProxySync {
    pub fn in_sync(&self) -> bool {
        self.types.iter().all(|t| t.in_sync)
    }
}
