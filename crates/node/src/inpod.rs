//! In-pod listeners: for each meshed pod of this node, the three listeners
//! opened inside its network namespace, created when the pod is registered
//! and drained when it goes. The pods served are reported in served.json.

use crate::proxy::Shared;
use crate::sockets::PodSockets;
use crate::sys::netns::Netns;
use crate::watch::Snapshot;
use crate::{inbound, outbound};
use futures_util::future::BoxFuture;
use slipstream_core::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT};
use slipstream_hbone::drain::{self, DrainTrigger, DrainWatch};
use slipstream_hbone::{Connector, Server, ServerConfig};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, RwLock};
use tokio::net::{TcpListener, TcpStream};

/// A meshed pod of this node, as the data path needs it.
#[derive(Clone)]
pub struct LocalPod {
    pub uid: String,
    pub ip: IpAddr,
    pub sockets: PodSockets,
    /// What this pod holds of its outbound bounds.
    pub limits: Arc<crate::limits::Source>,
}

/// Local pods by IP: how the HBONE pool dials from the right namespace.
#[derive(Clone, Default)]
pub struct LocalPods(Arc<RwLock<HashMap<IpAddr, LocalPod>>>);

impl LocalPods {
    pub fn get(&self, ip: IpAddr) -> Option<LocalPod> {
        self.0.read().expect("pods lock").get(&ip).cloned()
    }
    fn insert(&self, p: LocalPod) {
        self.0.write().expect("pods lock").insert(p.ip, p);
    }
    fn remove(&self, ip: IpAddr) {
        self.0.write().expect("pods lock").remove(&ip);
    }
    pub fn connector(&self) -> PodConnector {
        PodConnector(self.clone())
    }
}

/// Dials HBONE from the source pod's own namespace and address, marked so
/// that capture lets it through.
pub struct PodConnector(LocalPods);

impl Connector for PodConnector {
    fn connect(&self, dst: SocketAddr, src_ip: IpAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        let pod = self.0.get(src_ip);
        Box::pin(async move {
            let pod = pod.ok_or_else(|| io::Error::other(format!("no local pod has address {src_ip}")))?;
            pod.sockets.connect_marked(dst, std::time::Duration::from_secs(10)).await
        })
    }
}

struct Running {
    ip: IpAddr,
    drain: DrainTrigger,
}

pub struct InPod {
    shared: Arc<Shared>,
    running: HashMap<String, Running>,
    failed: BTreeSet<String>,
    last_served: Option<Vec<String>>,
}

impl InPod {
    pub fn new(shared: Arc<Shared>) -> Self {
        InPod { shared, running: HashMap::new(), failed: BTreeSet::new(), last_served: None }
    }

    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Opens listeners for new pods, drains removed ones, reports the set.
    pub async fn reconcile(&mut self, snap: &Snapshot) {
        let wanted: HashMap<&str, &str> = snap.pods.pods.iter().map(|p| (p.uid.as_str(), p.netns.as_str())).collect();
        let gone: Vec<String> = self.running.keys().filter(|u| !wanted.contains_key(u.as_str())).cloned().collect();
        for uid in gone {
            if let Some(r) = self.running.remove(&uid) {
                tracing::info!(pod = %uid, "pod removed: draining its listeners");
                self.shared.pods.remove(r.ip);
                let grace = self.shared.config.drain_period;
                tokio::spawn(r.drain.drain(grace));
            }
        }
        self.failed.clear();
        for (uid, netns) in wanted {
            if self.running.contains_key(uid) {
                continue;
            }
            let Some(w) = snap.mesh.workload(uid) else {
                // Registered before the mesh configuration names it: next time.
                self.failed.insert(uid.to_string());
                continue;
            };
            let Some(ip) = w.addresses.first().copied() else { continue };
            match self.start(uid, ip, Path::new(netns)) {
                Ok(r) => {
                    tracing::info!(pod = %uid, %ip, netns, "listening in the pod on :15001, :15006, :15008");
                    self.running.insert(uid.to_string(), r);
                }
                Err(e) => {
                    tracing::error!(pod = %uid, netns, "cannot open the pod's listeners: {e}");
                    self.failed.insert(uid.to_string());
                }
            }
        }
        self.report();
    }

    fn start(&self, uid: &str, ip: IpAddr, netns: &Path) -> io::Result<Running> {
        let sockets = PodSockets::new(Netns::open(netns)?);
        // All three bound before anything serves.
        let out = sockets.listen(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), OUTBOUND_PORT))?;
        let plain = sockets.listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), INBOUND_PLAINTEXT_PORT))?;
        let hbone = sockets.listen(SocketAddr::new(ip, HBONE_PORT))?;
        let pod = LocalPod { uid: uid.to_string(), ip, sockets, limits: self.shared.limits.for_pod() };
        let (trigger, watch) = drain::channel();
        let server = Server::new(
            hbone,
            self.shared.server_tls.clone(),
            Arc::new(inbound::Certs(self.shared.clone())),
            Arc::new(inbound::HboneHandler { shared: self.shared.clone(), pod: pod.clone() }),
            ServerConfig::default(),
        )
        .with_stats(self.shared.telemetry.metrics.hbone.clone());
        tokio::spawn(server.serve(watch.clone()));
        tokio::spawn(accept_loop(out, watch.clone(), {
            let (shared, pod) = (self.shared.clone(), pod.clone());
            move |s, peer| tokio::spawn(outbound::handle(shared.clone(), pod.clone(), s, peer))
        }));
        tokio::spawn(accept_loop(plain, watch, {
            let (shared, pod) = (self.shared.clone(), pod.clone());
            move |s, peer| tokio::spawn(inbound::handle_plaintext(shared.clone(), pod.clone(), s, peer))
        }));
        self.shared.pods.insert(pod);
        Ok(Running { ip, drain: trigger })
    }

    fn report(&mut self) {
        let mut uids: Vec<String> = self.running.keys().cloned().collect();
        uids.sort();
        if self.last_served.as_ref() == Some(&uids) {
            return;
        }
        let path = self.shared.config.served_file();
        let text = serde_json::to_string_pretty(&slipstream_core::Served { uids: uids.clone() }).unwrap_or_default();
        let tmp = path.with_extension("tmp");
        let written = path
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&tmp, text))
            .and_then(|_| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => self.last_served = Some(uids),
            Err(e) => tracing::error!("cannot write {}: {e}", path.display()),
        }
    }

    /// Drains every pod (graceful GOAWAY, open connections get the drain
    /// period), then returns.
    pub async fn drain_all(&mut self) {
        let grace = self.shared.config.drain_period;
        let drains: Vec<_> = self.running.drain().map(|(_, r)| r.drain.drain(grace)).collect();
        let _ = tokio::time::timeout(grace + std::time::Duration::from_secs(1), futures_util::future::join_all(drains)).await;
    }
}

/// Accepts until the drain starts; each connection goes to `f`.
async fn accept_loop<F>(l: TcpListener, drain: DrainWatch, f: F)
where
    F: Fn(TcpStream, SocketAddr) -> tokio::task::JoinHandle<()>,
{
    loop {
        tokio::select! {
            _ = drain.signaled() => return,
            r = l.accept() => match r {
                Ok((s, peer)) => { f(s, peer); }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nagle on the app side of an outbound connection would hold a response
    /// back until the app acks the previous segment: every connection a pod
    /// listener accepts must reach the handler with TCP_NODELAY set (set on
    /// the listener, inherited by what it accepts). Needs root for setns,
    /// as the node proxy does.
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let sockets = PodSockets::new(Netns::open(Path::new("/proc/self/ns/net")).unwrap());
        let l = sockets.listen(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let (_trigger, watch) = drain::channel();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(accept_loop(l, watch, move |s, _| {
            tx.send(s.nodelay().unwrap()).unwrap();
            tokio::spawn(async move { drop(s) })
        }));
        let _c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(rx.recv().await, Some(true));
    }
}
