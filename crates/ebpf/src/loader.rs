//! Loading the programs and attaching them to pods: the CNI's part of the
//! datapath (in the local cluster, the agent's), done once per pod before
//! its first process starts, as nftables capture was.
//!
//! Layout under the cluster's bpffs directory:
//!
//! ```text
//! /sys/fs/bpf/slipstream/<cluster>/maps/ss_*_v1        the shared maps
//! /sys/fs/bpf/slipstream/<cluster>/links/<pod>/<prog>  one pinned link per hook
//! ```
//!
//! Links are pinned, so the datapath does not depend on the process that
//! attached it: the agent or a node proxy can restart and the kernel keeps
//! steering and refusing. A new binary replaces each program in place
//! ([`Datapath::load`] updates every pinned link), without a moment
//! without a program and without touching open connections.

use crate::abi::{self, BackendKey, IpcacheKey, Local, OrigDst, Pod, Svc, SvcKey};
use crate::sys;
use aya::maps::HashMap;
use aya::programs::{CgroupSock, CgroupSockAddr, SchedClassifier, SockOps};
use aya::{Ebpf, EbpfLoader};
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

static CONNECT4: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/connect4.o"));
static GETPEERNAME4: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/getpeername4.o"));
static SENDMSG4: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sendmsg4.o"));
static CONNECT6: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/connect6.o"));
static SENDMSG6: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sendmsg6.o"));
static SOCKOPS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockops.o"));
static SOCK_RELEASE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sock_release.o"));
static TC_INGRESS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc_ingress.o"));
static TC_EGRESS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc_egress.o"));

/// The pod's interface, in its own network namespace.
pub const POD_DEVICE: &str = "eth0";

/// The links of the socket hooks, under `links/` (bpffs names have no
/// dot, and no pod key is a single word without `_`).
pub const SOCKET_HOOKS_DIR: &str = "node";

/// One hook of the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Connect4,
    Connect6,
    GetPeername4,
    SendMsg4,
    SendMsg6,
    SockOps,
    SockRelease,
    TcIngress,
    TcEgress,
}

impl Hook {
    pub const ALL: [Hook; 9] = [
        Hook::Connect4,
        Hook::Connect6,
        Hook::GetPeername4,
        Hook::SendMsg4,
        Hook::SendMsg6,
        Hook::SockOps,
        Hook::SockRelease,
        Hook::TcIngress,
        Hook::TcEgress,
    ];

    /// Attached to each pod's interface (else once, at the cgroup2 root).
    pub fn per_pod(self) -> bool {
        matches!(self, Hook::TcIngress | Hook::TcEgress)
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Connect4 => "connect4",
            Hook::Connect6 => "connect6",
            Hook::GetPeername4 => "getpeername4",
            Hook::SendMsg4 => "sendmsg4",
            Hook::SendMsg6 => "sendmsg6",
            Hook::SockOps => "sockops",
            Hook::SockRelease => "sock_release",
            Hook::TcIngress => "tc_ingress",
            Hook::TcEgress => "tc_egress",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Hook::Connect4 => "ss_connect4",
            Hook::Connect6 => "ss_connect6",
            Hook::GetPeername4 => "ss_getpeername4",
            Hook::SendMsg4 => "ss_sendmsg4",
            Hook::SendMsg6 => "ss_sendmsg6",
            Hook::SockOps => "ss_sockops",
            Hook::SockRelease => "ss_sock_release",
            Hook::TcIngress => "ss_tc_ingress",
            Hook::TcEgress => "ss_tc_egress",
        }
    }

    fn attach_type(self) -> u32 {
        match self {
            Hook::Connect4 => sys::ATTACH_CGROUP_INET4_CONNECT,
            Hook::Connect6 => sys::ATTACH_CGROUP_INET6_CONNECT,
            Hook::GetPeername4 => sys::ATTACH_CGROUP_INET4_GETPEERNAME,
            Hook::SendMsg4 => sys::ATTACH_CGROUP_UDP4_SENDMSG,
            Hook::SendMsg6 => sys::ATTACH_CGROUP_UDP6_SENDMSG,
            Hook::SockOps => sys::ATTACH_CGROUP_SOCK_OPS,
            Hook::SockRelease => sys::ATTACH_CGROUP_INET_SOCK_RELEASE,
            Hook::TcIngress => sys::ATTACH_TCX_INGRESS,
            Hook::TcEgress => sys::ATTACH_TCX_EGRESS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    #[error("loading the {hook} program: {error}")]
    Load { hook: &'static str, error: Box<dyn std::error::Error + Send + Sync> },
    #[error("map {map}: {error}")]
    Map { map: &'static str, error: aya::maps::MapError },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |error| Error::Io { what, error }
}

/// A pod as the datapath needs to know it.
#[derive(Debug, Clone)]
pub struct PodAttach<'a> {
    /// Unique per pod and usable as a bpffs file name (no dot).
    pub key: &'a str,
    pub netns: &'a Path,
    pub ip: Ipv4Addr,
    pub node: u16,
    pub meshed: bool,
}

/// Load-time settings of the programs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// The source the node gives its kubelet's probes of meshed pods (on
    /// Kubernetes, `slipstream_cni::capture::PROBE_SOURCE`): tc ingress
    /// leaves TCP from it to the pod's own stack, as the nftables capture
    /// does. None: no exception (the local cluster).
    pub probe_source: Option<Ipv4Addr>,
}

/// The programs' load-time constant for [`Options::probe_source`].
const PROBE_SOURCE_GLOBAL: &str = "ss_probe_source";

/// A service port as the connect-time balancer sees it (TCP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLb {
    pub vip: Ipv4Addr,
    pub port: u16,
    /// Ready endpoints: address and target port.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

/// The loaded programs and the shared maps of one cluster.
pub struct Datapath {
    dir: PathBuf,
    objects: Vec<(Hook, Ebpf)>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Datapath {
    /// Loads every program into the kernel (creating or reusing the pinned
    /// maps under `dir/maps`) and moves every link already pinned under
    /// `dir/links` to the new programs. An error here means the kernel
    /// cannot run this datapath; the message says which part failed.
    pub fn load(dir: &Path) -> Result<Self, Error> {
        Self::load_with(dir, &Options::default())
    }

    /// As [`Datapath::load`], with the load-time settings of `options`.
    pub fn load_with(dir: &Path, options: &Options) -> Result<Self, Error> {
        let probe_source = options.probe_source.map(abi::ip_key).unwrap_or(0);
        let maps = dir.join("maps");
        std::fs::create_dir_all(&maps).map_err(io(format!("creating {}", maps.display())))?;
        std::fs::create_dir_all(dir.join("links")).map_err(io(format!("creating {}", dir.join("links").display())))?;
        let mut objects = Vec::new();
        for (hook, bytes) in [
            (Hook::Connect4, CONNECT4),
            (Hook::Connect6, CONNECT6),
            (Hook::GetPeername4, GETPEERNAME4),
            (Hook::SendMsg4, SENDMSG4),
            (Hook::SendMsg6, SENDMSG6),
            (Hook::SockOps, SOCKOPS),
            (Hook::SockRelease, SOCK_RELEASE),
            (Hook::TcIngress, TC_INGRESS),
            (Hook::TcEgress, TC_EGRESS),
        ] {
            let load_err = |e: Box<dyn std::error::Error + Send + Sync>| Error::Load { hook: hook.name(), error: e };
            let mut obj = EbpfLoader::new()
                .map_pin_path(&maps)
                .set_global(PROBE_SOURCE_GLOBAL, &probe_source, false)
                .load(bytes)
                .map_err(|e| load_err(e.into()))?;
            let prog = obj.program_mut(hook.program()).ok_or_else(|| load_err("program missing from its object".into()))?;
            match hook {
                Hook::Connect4 | Hook::Connect6 | Hook::GetPeername4 | Hook::SendMsg4 | Hook::SendMsg6 => {
                    let p: &mut CgroupSockAddr = prog.try_into().map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
                    p.load().map_err(|e| load_err(e.into()))?;
                }
                Hook::SockOps => {
                    let p: &mut SockOps = prog.try_into().map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
                    p.load().map_err(|e| load_err(e.into()))?;
                }
                Hook::SockRelease => {
                    let p: &mut CgroupSock = prog.try_into().map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
                    p.load().map_err(|e| load_err(e.into()))?;
                }
                Hook::TcIngress | Hook::TcEgress => {
                    let p: &mut SchedClassifier = prog.try_into().map_err(|e: aya::programs::ProgramError| load_err(e.into()))?;
                    p.load().map_err(|e| load_err(e.into()))?;
                }
            }
            objects.push((hook, obj));
        }
        let dp = Datapath { dir: dir.to_path_buf(), objects };
        dp.upgrade_links()?;
        Ok(dp)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The loaded program of a hook (tests run it with BPF_PROG_TEST_RUN).
    pub fn prog_fd(&self, hook: Hook) -> std::os::fd::BorrowedFd<'_> {
        let obj = &self.objects.iter().find(|(h, _)| *h == hook).expect("every hook is loaded").1;
        let prog = obj.program(hook.program()).expect("loaded above");
        let fd = match hook {
            Hook::Connect4 | Hook::Connect6 | Hook::GetPeername4 | Hook::SendMsg4 | Hook::SendMsg6 => {
                <&CgroupSockAddr>::try_from(prog).expect("type checked at load").fd()
            }
            Hook::SockOps => <&SockOps>::try_from(prog).expect("type checked at load").fd(),
            Hook::SockRelease => <&CgroupSock>::try_from(prog).expect("type checked at load").fd(),
            Hook::TcIngress | Hook::TcEgress => <&SchedClassifier>::try_from(prog).expect("type checked at load").fd(),
        };
        fd.expect("loaded above").as_fd()
    }

    /// Moves every pinned link to the programs just loaded (an upgrade).
    fn upgrade_links(&self) -> Result<(), Error> {
        let links = self.dir.join("links");
        let Ok(pods) = std::fs::read_dir(&links) else { return Ok(()) };
        let mut moved = 0;
        for pod in pods.flatten() {
            for hook in Hook::ALL {
                let pin = pod.path().join(hook.name());
                let Ok(link) = sys::obj_get(&pin) else { continue };
                sys::link_update(link.as_fd(), self.prog_fd(hook)).map_err(io(format!("replacing the program of {}", pin.display())))?;
                moved += 1;
            }
        }
        if moved > 0 {
            tracing::info!(links = moved, "datapath programs replaced in place; open connections are untouched");
        }
        Ok(())
    }

    /// A hash map of the loaded objects (all share the pinned maps; any
    /// object that declares it will do).
    fn hash_map<K: aya::Pod, V: aya::Pod>(&mut self, name: &'static str) -> Result<HashMap<&mut aya::maps::MapData, K, V>, Error> {
        let m = self
            .objects
            .iter_mut()
            .find_map(|(_, o)| o.map_mut(name))
            .ok_or(Error::Map { map: name, error: aya::maps::MapError::InvalidName { name: name.into() } })?;
        HashMap::try_from(m).map_err(|error| Error::Map { map: name, error })
    }

    /// Puts a pod on the datapath: its namespace in `ss_pods_v1` (the socket
    /// hooks then treat its sockets as the pod's: policy always, capture
    /// when meshed) and the tc program on its interface (inbound policy;
    /// capture when meshed).
    /// Nothing is left behind when a step fails.
    pub fn enrol(&mut self, p: &PodAttach) -> Result<(), Error> {
        let r = self.try_enrol(p);
        if r.is_err() {
            let _ = self.withdraw(p.key, p.ip);
        }
        r
    }

    fn try_enrol(&mut self, p: &PodAttach) -> Result<(), Error> {
        let cookie = sys::netns_cookie_of(p.netns).map_err(io(format!("the network namespace cookie of {}", p.netns.display())))?;
        let flags = if p.meshed { abi::POD_MESHED } else { 0 } | abi::POD_FLOWS;
        let ip = abi::ip_key(p.ip);
        self.hash_map::<u64, Pod>(abi::maps::PODS)?
            .insert(cookie, Pod { ip, node: p.node, flags }, 0)
            .map_err(|error| Error::Map { map: abi::maps::PODS, error })?;
        self.hash_map::<u32, Local>(abi::maps::LOCAL)?
            .insert(ip, Local { node: p.node, flags, pad: 0 }, 0)
            .map_err(|error| Error::Map { map: abi::maps::LOCAL, error })?;
        // Inbound policy (every pod), capture (meshed pods) and the flows
        // of what is not TCP, both ways, are per pod: programs on its
        // interface.
        // Its eth0 by hardware address, for what has no IPv4 header.
        let mac =
            sys::in_netns(p.netns, || sys::hwaddr(POD_DEVICE)).map_err(io(format!("the address of {POD_DEVICE} of pod {}", p.key)))?;
        self.hash_map::<abi::MacKey, Pod>(abi::maps::MACS)?
            .insert(abi::MacKey { addr: mac, pad: 0 }, Pod { ip, node: p.node, flags }, 0)
            .map_err(|error| Error::Map { map: abi::maps::MACS, error })?;
        let links = self.dir.join("links").join(p.key);
        std::fs::create_dir_all(&links).map_err(io(format!("creating {}", links.display())))?;
        for hook in Hook::ALL.into_iter().filter(|h| h.per_pod()) {
            let prog = self.prog_fd(hook);
            let link = sys::in_netns(p.netns, || sys::link_create_ifindex(prog, sys::ifindex(POD_DEVICE)?, hook.attach_type()))
                .map_err(io(format!("attaching {} to pod {}", hook.name(), p.key)))?;
            let pin = links.join(hook.name());
            let _ = std::fs::remove_file(&pin);
            sys::obj_pin(link.as_fd(), &pin).map_err(io(format!("pinning {}", pin.display())))?;
        }
        Ok(())
    }

    /// Attaches the socket hooks (every hook but tc ingress: connect4/6,
    /// getpeername4, sendmsg4/6, sockops, sock_release) once at
    /// the root of the cgroup2 hierarchy, where every socket of the node
    /// meets them: each acts only on sockets of the namespaces of pods in
    /// `ss_pods_v1`. Already pinned (a restart): kept, with the programs
    /// just loaded (see [`Datapath::load`]).
    pub fn attach_socket_hooks(&mut self) -> Result<(), Error> {
        let root = sys::cgroup2_root().map_err(io("finding the cgroup2 hierarchy"))?;
        self.attach_socket_hooks_at(&root)
    }

    /// As [`Datapath::attach_socket_hooks`], at `root`, a directory of the
    /// cgroup2 hierarchy: only sockets of processes in its subtree meet the
    /// hooks. Where several nodes share one kernel (the Kubernetes test
    /// harness, docs/kube-harness.md), each node's datapath is attached at
    /// its own subtree, with its own bpffs directory.
    pub fn attach_socket_hooks_at(&mut self, root: &Path) -> Result<(), Error> {
        let cgroup = File::open(root).map_err(io(format!("opening cgroup {}", root.display())))?;
        let id = std::os::unix::fs::MetadataExt::ino(&cgroup.metadata().map_err(io(format!("reading cgroup {}", root.display())))?);
        let links = self.dir.join("links").join(SOCKET_HOOKS_DIR);
        std::fs::create_dir_all(&links).map_err(io(format!("creating {}", links.display())))?;
        for hook in Hook::ALL.into_iter().filter(|h| !h.per_pod()) {
            let pin = links.join(hook.name());
            // Kept only when attached to this very cgroup: a pin left by a
            // datapath attached elsewhere (another --cgroup, or a cgroup
            // removed and made again) would hook nothing here.
            match sys::obj_get(&pin).and_then(|l| sys::link_cgroup_id(l.as_fd())) {
                Ok(at) if at == id => continue,
                Ok(at) => {
                    tracing::info!(hook = hook.name(), was = at, now = id, cgroup = %root.display(), "socket hook pinned at another cgroup: attached again here");
                    let _ = std::fs::remove_file(&pin);
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&pin);
                }
            }
            let link = sys::link_create(self.prog_fd(hook), cgroup.as_fd(), hook.attach_type()).map_err(io(format!(
                "attaching {} to cgroup {}",
                hook.name(),
                root.display()
            )))?;
            sys::obj_pin(link.as_fd(), &pin).map_err(io(format!("pinning {}", pin.display())))?;
        }
        Ok(())
    }

    /// Makes the connect-time load balancer hold exactly these services.
    /// Endpoints first, then the count that makes them visible; stale
    /// entries last.
    pub fn set_services(&mut self, services: &[ServiceLb]) -> Result<(), Error> {
        let mut want_svc = std::collections::BTreeMap::new();
        let mut want_be = std::collections::BTreeMap::new();
        for ServiceLb { vip, port, endpoints: eps } in services {
            let vip = abi::ip_key(*vip);
            for (i, (ip, p)) in eps.iter().enumerate().take(u16::MAX as usize) {
                want_be.insert(BackendKey { vip, port: *port, index: i as u16 }, OrigDst { ip: abi::ip_key(*ip), port: *p, pad: 0 });
            }
            want_svc.insert(
                SvcKey { vip, port: *port, proto: abi::IPPROTO_TCP, pad: 0 },
                Svc { count: eps.len().min(u16::MAX as usize) as u32, pad: 0 },
            );
        }
        let mut be = self.hash_map::<BackendKey, OrigDst>(abi::maps::BACKENDS)?;
        for (k, v) in &want_be {
            be.insert(*k, *v, 0).map_err(|error| Error::Map { map: abi::maps::BACKENDS, error })?;
        }
        let mut svc = self.hash_map::<SvcKey, Svc>(abi::maps::SERVICES)?;
        for (k, v) in &want_svc {
            svc.insert(*k, *v, 0).map_err(|error| Error::Map { map: abi::maps::SERVICES, error })?;
        }
        let stale: Vec<SvcKey> = svc.keys().flatten().filter(|k| !want_svc.contains_key(k)).collect();
        for k in stale {
            let _ = svc.remove(&k);
        }
        let mut be = self.hash_map::<BackendKey, OrigDst>(abi::maps::BACKENDS)?;
        let stale: Vec<BackendKey> = be.keys().flatten().filter(|k| !want_be.contains_key(k)).collect();
        for k in stale {
            let _ = be.remove(&k);
        }
        Ok(())
    }

    /// Detaches the datapath from a pod and forgets it. Idempotent.
    pub fn withdraw(&mut self, key: &str, ip: Ipv4Addr) -> Result<(), Error> {
        let node = self.hash_map::<u32, Local>(abi::maps::LOCAL)?.get(&abi::ip_key(ip), 0).ok().map(|l| l.node);
        let links = self.dir.join("links").join(key);
        if links.exists() {
            // A link detaches when its last reference (the pin) goes.
            std::fs::remove_dir_all(&links).map_err(io(format!("removing {}", links.display())))?;
        }
        let ipk = abi::ip_key(ip);
        let _ = self.hash_map::<u32, Local>(abi::maps::LOCAL)?.remove(&ipk);
        // Its hardware address (the entry names the pod's IPv4 address:
        // the namespace may be gone already).
        let mut macs = self.hash_map::<abi::MacKey, Pod>(abi::maps::MACS)?;
        let stale: Vec<abi::MacKey> = macs.iter().flatten().filter(|(_, v)| v.ip == ipk).map(|(k, _)| k).collect();
        for k in &stale {
            let _ = macs.remove(k);
        }
        let mut pods = self.hash_map::<u64, Pod>(abi::maps::PODS)?;
        let stale: Vec<u64> = pods.iter().flatten().filter(|(_, v)| v.ip == ipk).map(|(k, _)| k).collect();
        for k in &stale {
            let _ = pods.remove(k);
        }
        // Its pending-connect counter goes with its namespace.
        let mut pending = self.hash_map::<u64, abi::Pending>(abi::maps::PENDING)?;
        for k in &stale {
            let _ = pending.remove(k);
        }
        // Its identity in its node's numbering (what its own connect() and
        // tc ingress look up), so that a pod given its address later starts
        // with none (its node proxy writes the new one).
        if let Some(node) = node {
            let _ = self.hash_map::<IpcacheKey, u32>(abi::maps::IPCACHE)?.remove(&IpcacheKey::new(node, ip));
        }
        // Its flows, and other pods' flows with it, so that a pod given
        // its address later neither inherits the replies this one was owed
        // nor passes as the peer of another pod's old flow.
        let mut flows = self.hash_map::<abi::FlowKey, abi::Flow>(abi::maps::FLOWS)?;
        let stale: Vec<abi::FlowKey> = flows.keys().flatten().filter(|k| k.pod_ip == ipk || k.peer_ip == ipk).collect();
        for k in &stale {
            let _ = flows.remove(k);
        }
        Ok(())
    }
}

/// Removes every program, link and map of a cluster (`slipstream down`).
pub fn remove_all(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        r => r?,
    }
    // The directory of every datapath (`/sys/fs/bpf/slipstream`) goes with
    // the last one: nothing of ours is left in bpffs (a parent still holding
    // another datapath is not empty, and stays).
    if let Some(parent) = dir.parent().filter(|p| p.file_name().is_some_and(|n| n == "slipstream")) {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn remove_all_takes_the_datapaths_directory_with_the_last_one() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("slipstream/a"), root.path().join("slipstream/b"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d.join("maps")).unwrap();
        }
        super::remove_all(&a).unwrap();
        assert!(!a.exists() && b.exists(), "another datapath keeps the directory");
        super::remove_all(&b).unwrap();
        assert!(!root.path().join("slipstream").exists(), "the last one takes it");
        super::remove_all(&b).unwrap();
        let other = root.path().join("elsewhere/c");
        std::fs::create_dir_all(&other).unwrap();
        super::remove_all(&other).unwrap();
        assert!(root.path().join("elsewhere").exists(), "only our own directory's name is removed");
    }
}
