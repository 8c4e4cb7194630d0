//! Mesh-wide settings the waypoint applies, read from Istio's MeshConfig
//! (the `mesh` key of the `istio` ConfigMap in the root namespace) by the
//! control plane and sent to waypoints: how request paths are normalized
//! before anything reads them, and how many proxies in front of the mesh
//! are trusted to have written `X-Forwarded-For`.

pub use crate::path::PathNormalization;

/// The settings, each with Istio's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct MeshSettings {
    /// `meshConfig.pathNormalization.normalization` (default `BASE`).
    pub path_normalization: PathNormalization,
    /// `meshConfig.defaultConfig.gatewayTopology.numTrustedProxies`
    /// (default 0): how many addresses at the right of `X-Forwarded-For`
    /// were written by proxies the operator trusts. The waypoint reads the
    /// `remote.ip` of a request (`remoteIpBlocks`) from there; the peer
    /// of the connection stays `source.ip` (`ipBlocks`).
    pub num_trusted_proxies: u32,
}
