//! What the kernel may decide, compiled from the same engine and the same
//! snapshot as the node proxy.
//!
//! **Identities.** Workloads are grouped by what policy can tell apart
//! about them ([`Signature`]): their SPIFFE identity (trust domain,
//! namespace, service account), whether they are meshed, the network
//! policies and authorization policies that select them (their labels, as
//! the control plane resolved the selectors), the peer lists and address
//! blocks their address falls in, and their named ports. The engine reads
//! nothing else of a workload, so two workloads of one class get the same
//! verdict on every port, as source and as destination. Each class gets a
//! numeric identity in this node's numbering ([`Identities`]: stable while
//! the class lives, never reused, kept across a restart of the node proxy
//! through what the map holds); each service address gets one of its own.
//! The kernel maps an address to its identity (`ss_ipcache_v1`), and
//! decisions are between identities (`ss_policy_v2`): one entry per pair
//! of classes instead of per pair of pods.
//!
//! **Decisions.** For each pair of classes with a member on this node at
//! either end (the source's connect() and the destination's tc ingress
//! both look here), the verdict of [`engine::connection`] on every port a
//! governing policy singles out, and on one port none does (standing for
//! all the others; flagged [`POLICY_F_ALL_PORTS`] when no port of the pair
//! is allowed). A service address gets an entry for a declared port when
//! every ready endpoint of that port is denied to the source class.
//!
//! Only what the engine decides is written, so the kernel never denies
//! what the proxy would allow: no entry means "no say" and the connection
//! goes on to the proxy (or, outside the mesh, to the destination). Pairs
//! whose policies name port ranges wider than [`MAX_RANGE_PORTS`] are left
//! to the proxy and the nftables path (an honest gap, counted in
//! [`Compiled::skipped_pairs`]). Pure: snapshot in, entries out.
//!
//! The classes and their numbering are in [`identities`], the entries
//! between them in `verdicts`.

mod identities;
mod verdicts;

pub use identities::{Identities, Prefix, Signature};

use crate::abi::{IpcacheKey, PolicyKey, PolicyValue};
use slipstream_core::MeshState;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

/// Port ranges (`endPort`) up to this many ports are expanded port by port.
pub const MAX_RANGE_PORTS: u32 = 1024;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// Every known IPv4 workload and service address, to its identity.
    pub ipcache: BTreeMap<IpcacheKey, u32>,
    pub entries: BTreeMap<PolicyKey, PolicyValue>,
    /// What each entry's `rule` refers to (index + 1): the explanation of
    /// the deciding layer, as `policy check` words it.
    pub rules: Vec<String>,
    /// Pairs of classes left to user space.
    pub skipped_pairs: usize,
    /// This node's pods with a pair (or a service) the map cannot decide
    /// exactly (a port range too wide to expand; a UDP or SCTP service
    /// some endpoints of which their egress allows and some not): the node
    /// proxy keeps them in the nftables table, which decides the rest.
    pub left_to_nftables: BTreeSet<Ipv4Addr>,
    /// How many workload classes (identities) the snapshot has.
    pub classes: usize,
    /// The ipcache keys of this node's own pods.
    pub local: BTreeSet<IpcacheKey>,
    /// Addresses outside the cluster: prefix (longest match wins) to
    /// identity, in this node's numbering (`ss_world_v1`).
    pub world: BTreeMap<(u16, Prefix), u32>,
}

/// Compiles the kernel's part of policy for `node` (index `node_index` in
/// the maps), numbering classes with `ids`.
pub fn compile(state: &MeshState, node: &str, node_index: u16, ids: &mut Identities) -> Compiled {
    let mut out = Compiled::default();
    let classes = identities::classify(state, node, node_index, ids, &mut out);
    verdicts::write(&verdicts::Scope { state, node, node_index, classes: &classes }, out)
}
