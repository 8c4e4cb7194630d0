//! The node proxy's side of the datapath: the pinned maps it reads and
//! writes. It finds where a captured connection was going, registers its
//! plaintext listeners for inbound capture, keeps the policy map equal to
//! what the engine compiles for its pods, and reads the drop counters.

use crate::abi::{self, DropReason, IpcacheKey, OrigDstKey, PolicyKey, PolicyValue, WorldAddr};
use crate::kernel_policy::Compiled;
use crate::kernel_policy::Prefix;
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{HashMap, Map, MapData, PerCpuArray, SockHash};
use slipstream_core::sync::LockExt;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening the pinned map {path}: {error}")]
    Open { path: String, error: aya::maps::MapError },
    #[error("map {map}: {error}")]
    Map { map: &'static str, error: aya::maps::MapError },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn open(dir: &Path, name: &'static str) -> Result<MapData, Error> {
    let path = dir.join("maps").join(name);
    MapData::from_pin(&path).map_err(|error| Error::Open { path: path.display().to_string(), error })
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |error| Error::Map { map, error }
}

pub struct NodeMaps {
    node: u16,
    /// Read with our own lookup-and-delete (one system call).
    origdst: MapData,
    listeners: Mutex<SockHash<MapData, u32>>,
    policy: Mutex<HashMap<MapData, PolicyKey, PolicyValue>>,
    ipcache: Mutex<HashMap<MapData, IpcacheKey, u32>>,
    world: Mutex<LpmTrie<MapData, WorldAddr, u32>>,
    local: HashMap<MapData, u32, abi::Local>,
    /// What the policy map and the ipcache hold in this node's numbering;
    /// None until the first sync adopts what a previous run of the proxy
    /// left there.
    written: Mutex<Option<Written>>,
    drops: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for NodeMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeMaps").field("node", &self.node).finish_non_exhaustive()
    }
}

/// A connection steered at connect(): the address the app dialed and, when
/// it dialed a service, the endpoint the kernel chose for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steered {
    pub dialed: SocketAddrV4,
    pub endpoint: Option<SocketAddrV4>,
}

#[derive(Debug, Default)]
struct Written {
    policy: BTreeMap<PolicyKey, PolicyValue>,
    ipcache: BTreeMap<IpcacheKey, u32>,
    world: BTreeMap<(u16, Prefix), u32>,
}

/// The world prefixes `node`'s numbering holds in the map, with their
/// identities.
fn world_of(world: &LpmTrie<MapData, WorldAddr, u32>, node: u16) -> Vec<((u16, Prefix), u32)> {
    world
        .iter()
        .flatten()
        .filter(|(k, _)| k.data().node == node && k.prefix_len() >= 32)
        .map(|(k, id)| ((node, Prefix::of(abi::ip_from_key(k.data().ip), (k.prefix_len() - 32) as u8)), id))
        .collect()
}

fn world_key(node: u16, p: &Prefix) -> LpmKey<WorldAddr> {
    LpmKey::new(32 + u32::from(p.len), WorldAddr { node, pad: 0, ip: abi::ip_key(p.address()) })
}

/// What one policy sync changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sync {
    pub written: usize,
    pub removed: usize,
    pub total: usize,
    /// Addresses whose identity was written or removed.
    pub addresses: usize,
}

impl NodeMaps {
    /// Opens the maps the agent pinned under `dir/maps`.
    pub fn open(dir: &Path, node: u16) -> Result<Self, Error> {
        let origdst = open(dir, abi::maps::ORIGDST)?;
        let listeners = SockHash::try_from(Map::SockHash(open(dir, abi::maps::LISTENERS)?)).map_err(map_err(abi::maps::LISTENERS))?;
        let policy = HashMap::try_from(Map::HashMap(open(dir, abi::maps::POLICY)?)).map_err(map_err(abi::maps::POLICY))?;
        let ipcache = HashMap::try_from(Map::HashMap(open(dir, abi::maps::IPCACHE)?)).map_err(map_err(abi::maps::IPCACHE))?;
        let world = LpmTrie::try_from(Map::LpmTrie(open(dir, abi::maps::WORLD)?)).map_err(map_err(abi::maps::WORLD))?;
        let drops = PerCpuArray::try_from(Map::PerCpuArray(open(dir, abi::maps::DROPS)?)).map_err(map_err(abi::maps::DROPS))?;
        let local = HashMap::try_from(Map::HashMap(open(dir, abi::maps::LOCAL)?)).map_err(map_err(abi::maps::LOCAL))?;
        Ok(NodeMaps {
            local,
            node,
            origdst,
            listeners: Mutex::new(listeners),
            policy: Mutex::new(policy),
            ipcache: Mutex::new(ipcache),
            world: Mutex::new(world),
            written: Mutex::new(None),
            drops,
        })
    }

    /// Where a connection accepted on a pod's outbound listener was going:
    /// `netns` is the listener's network namespace cookie, `peer` the
    /// accepted socket's peer (the client socket's own address and port:
    /// only that socket's entry is found). The entry is consumed.
    pub fn take_original_dst(&self, netns: u64, peer: std::net::SocketAddrV4) -> Option<Steered> {
        let key = OrigDstKey { netns, ip: abi::ip_key(*peer.ip()), port: peer.port(), pad: 0 };
        let v: abi::OrigDstEntry = crate::sys::map_take(self.origdst.fd().as_fd(), &key).ok()??;
        Some(Steered { dialed: v.steer.dialed(), endpoint: v.steer.endpoint() })
    }

    /// Registers a pod's plaintext listener for inbound capture.
    pub fn register_listener<F: AsFd>(&self, pod_ip: Ipv4Addr, listener: &F) -> Result<(), Error> {
        let fd = listener.as_fd().as_raw_fd();
        self.listeners.locked().insert(abi::ip_key(pod_ip), fd, 0).map_err(map_err(abi::maps::LISTENERS))
    }

    /// The addresses of this node's pods that the CNI put on the datapath
    /// with both tc programs (`ss_local_v1`, flag `POD_FLOWS`): their
    /// network policies are the programs', at both ends and for every
    /// protocol, so the nftables path may leave them out. A pod enrolled by
    /// an older version lacks the flag and stays in nftables.
    pub fn pods_on_datapath(&self) -> std::collections::BTreeSet<Ipv4Addr> {
        self.local
            .iter()
            .flatten()
            .filter(|(_, l)| l.node == self.node && l.flags & abi::POD_FLOWS != 0)
            .map(|(ip, _)| abi::ip_from_key(ip))
            .collect()
    }

    /// This node's index in the maps (the `--datapath-index` it runs with).
    pub fn node_index(&self) -> u16 {
        self.node
    }

    /// The identities a previous run of the node proxy numbered (its
    /// ipcache and world entries for this node).
    pub fn prior_identities(&self) -> crate::kernel_policy::Identities {
        let ipcache = self.ipcache.locked();
        let addresses: Vec<(Ipv4Addr, u32)> =
            ipcache.iter().flatten().filter(|(k, _)| k.node == self.node).map(|(k, id)| (abi::ip_from_key(k.ip), id)).collect();
        let world = self.world.locked();
        let prefixes: Vec<(Prefix, u32)> = world_of(&world, self.node).into_iter().map(|((_, p), id)| (p, id)).collect();
        let policy = self.policy.locked();
        let highest = policy.keys().flatten().filter(|k| k.node == self.node).map(|k| k.src_id.max(k.dst_id)).max().unwrap_or(0);
        crate::kernel_policy::Identities::adopt(addresses, prefixes, highest)
    }

    /// Makes the maps hold what `c` compiled for this node, in an order
    /// where a lookup never meets a number without its entries: new and
    /// changed decisions first, then addresses to their (possibly new)
    /// identities, then addresses no longer known, then stale decisions.
    pub fn sync_policy(&self, c: &Compiled) -> Result<Sync, Error> {
        let mut guard = self.written.locked();
        let mut policy = self.policy.locked();
        let mut ipcache = self.ipcache.locked();
        let mut world = self.world.locked();
        let node = self.node;
        let written = guard.get_or_insert_with(|| Written {
            policy: policy.iter().flatten().filter(|(k, _)| k.node == node).collect(),
            ipcache: ipcache.iter().flatten().filter(|(k, _)| k.node == node).collect(),
            world: world_of(&world, node).into_iter().collect(),
        });
        let mut s = Sync::default();
        for (k, v) in &c.entries {
            if written.policy.get(k) != Some(v) {
                policy.insert(*k, *v, 0).map_err(map_err(abi::maps::POLICY))?;
                written.policy.insert(*k, *v);
                s.written += 1;
            }
        }
        for (k, id) in &c.ipcache {
            // This node's pods are checked against the map itself: the
            // agent removes a deleted pod's entry (its address may come
            // back on a new pod), behind this cache's back.
            let here = c.local.contains(k) && ipcache.get(k, 0).ok() != Some(*id);
            if here || written.ipcache.get(k) != Some(id) {
                ipcache.insert(*k, *id, 0).map_err(map_err(abi::maps::IPCACHE))?;
                written.ipcache.insert(*k, *id);
                s.addresses += 1;
            }
        }
        for (k, id) in &c.world {
            if written.world.get(k) != Some(id) {
                world.insert(&world_key(k.0, &k.1), *id, 0).map_err(map_err(abi::maps::WORLD))?;
                written.world.insert(*k, *id);
                s.addresses += 1;
            }
        }
        let stale: Vec<(u16, Prefix)> = written.world.keys().filter(|k| !c.world.contains_key(k)).copied().collect();
        for k in stale {
            let _ = world.remove(&world_key(k.0, &k.1));
            written.world.remove(&k);
            s.addresses += 1;
        }
        let stale: Vec<IpcacheKey> = written.ipcache.keys().filter(|k| !c.ipcache.contains_key(k)).copied().collect();
        for k in stale {
            let _ = ipcache.remove(&k);
            written.ipcache.remove(&k);
            s.addresses += 1;
        }
        let stale: Vec<PolicyKey> = written.policy.keys().filter(|k| !c.entries.contains_key(k)).copied().collect();
        for k in stale {
            let _ = policy.remove(&k);
            written.policy.remove(&k);
            s.removed += 1;
        }
        s.total = written.policy.len();
        Ok(s)
    }

    /// Drops of this node by reason, summed over CPUs.
    pub fn drops(&self) -> Vec<(DropReason, u64)> {
        DropReason::ALL
            .into_iter()
            .map(|r| {
                let idx = u32::from(self.node) * abi::DROP_MAX + r as u32;
                let n = self.drops.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0);
                (r, n)
            })
            .collect()
    }
}
