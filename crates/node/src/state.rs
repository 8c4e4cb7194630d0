//! What every task of the node proxy shares. A leaf for the data path: it
//! imports only leaf modules (config, telemetry, limits, conns, sockets),
//! and `outbound`, `inbound`, `inpod`, `admin` and `proxy` build on it.

use crate::config::Config;
use crate::conns::Conns;
use crate::ready;
use crate::sockets::{PodSockets, SocketFactory};
use crate::telemetry::Telemetry;
use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use slipstream_core::sync::{LockExt, RwLockExt};
use slipstream_core::MeshState;
use slipstream_hbone::{Connector, Pool};
use slipstream_identity::tls::ServerTls;
use slipstream_identity::CertManager;
use slipstream_proxy::limits::{NodeLimits, Source};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use tokio::net::TcpStream;

pub struct Shared {
    pub config: Config,
    /// The current mesh snapshot: every connection decides over exactly one
    /// (`load_full`), without a lock.
    pub mesh: ArcSwap<MeshState>,
    pub certs: CertManager,
    pub server_tls: ServerTls,
    pub pool: Pool,
    pub telemetry: Arc<Telemetry>,
    pub pods: LocalPods,
    /// Node-wide counters of what each source holds (docs: "Limits").
    pub limits: NodeLimits,
    /// Pods a peer (a waypoint) asked to hold off, and until when.
    pub hold_offs: slipstream_proxy::limits::HoldOffs,
    pub sockets: Arc<dyn SocketFactory>,
    /// What readiness is decided from (see `ready`).
    pub readiness: Mutex<ready::Inputs>,
}

impl Shared {
    pub fn snapshot(&self) -> Arc<MeshState> {
        self.mesh.load_full()
    }

    /// Ok, or why the proxy is not ready.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let inputs = self.readiness.locked().clone();
        ready::evaluate(&inputs, &self.certs.certificates(), std::time::SystemTime::now())
    }
}

/// A meshed pod of this node, as the data path needs it.
#[derive(Clone)]
pub struct LocalPod {
    pub uid: Arc<str>,
    pub ip: IpAddr,
    pub sockets: Arc<dyn PodSockets>,
    /// What this pod holds of its outbound bounds.
    pub limits: Arc<Source>,
    /// Its open connections, with their cancellation handles.
    pub conns: Arc<Conns>,
}

/// Local pods by IP: how the HBONE pool dials from the right namespace.
#[derive(Clone, Default)]
pub struct LocalPods(Arc<RwLock<HashMap<IpAddr, LocalPod>>>);

impl LocalPods {
    pub fn get(&self, ip: IpAddr) -> Option<LocalPod> {
        self.0.read_locked().get(&ip).cloned()
    }
    pub fn insert(&self, p: LocalPod) {
        self.0.write_locked().insert(p.ip, p);
    }
    pub fn remove(&self, ip: IpAddr) {
        self.0.write_locked().remove(&ip);
    }
    pub fn all(&self) -> Vec<LocalPod> {
        self.0.read_locked().values().cloned().collect()
    }
    pub fn connector(&self, timeout: std::time::Duration) -> PodConnector {
        PodConnector { pods: self.clone(), timeout }
    }
}

/// Dials HBONE from the source pod's own namespace and address, marked so
/// that capture lets it through.
pub struct PodConnector {
    pods: LocalPods,
    timeout: std::time::Duration,
}

impl Connector for PodConnector {
    fn connect(&self, dst: SocketAddr, src_ip: IpAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        match self.pods.get(src_ip) {
            Some(pod) => pod.sockets.connect_marked(dst, self.timeout),
            None => Box::pin(async move { Err(io::Error::other(format!("no local pod has address {src_ip}"))) }),
        }
    }
}
