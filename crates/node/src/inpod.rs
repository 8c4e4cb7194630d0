//! In-pod listeners: for each meshed pod of this node, the three listeners
//! opened inside its network namespace, created when the pod is registered
//! and drained when it goes. The pods served are reported in served.json.
//!
//! Draining a pod (it left, or the proxy is stopping) is one procedure for
//! every kind of connection: the listeners stop accepting and the HBONE
//! server sends GOAWAY; open connections (outbound, HBONE inbound,
//! plaintext) get the grace period to finish; what is still open then is
//! cancelled and closes itself with `CONNECTION_TERMINATED`; after the
//! short force period the drain is over whatever is left.

use crate::conns::Conns;
use crate::ready::PodState;
use crate::sockets::Listener;
use crate::state::{LocalPod, Shared};
use crate::{inbound, outbound};
use slipstream_core::sync::LockExt;
use slipstream_core::{MeshState, NodePods};
use slipstream_hbone::drain::{self, DrainTrigger, DrainWatch};
use slipstream_hbone::{shard, Server};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

struct Running {
    ip: IpAddr,
    drain: DrainTrigger,
    conns: Arc<Conns>,
    /// Its certificate was asked for ahead of its first connection (once
    /// the mesh names the pod: at once in the local cluster, later for a
    /// pod registered from its CNI call on Kubernetes).
    /// Cleared again when the request failed, so the next reconcile asks again.
    cert_requested: Arc<std::sync::atomic::AtomicBool>,
}

pub struct InPod {
    shared: Arc<Shared>,
    running: HashMap<String, Running>,
    failed: BTreeSet<String>,
    last_served: Option<Vec<String>>,
    /// Writes served.json (off in the in-process tests).
    report_file: bool,
}

impl InPod {
    pub fn new(shared: Arc<Shared>, report_file: bool) -> Self {
        InPod { shared, running: HashMap::new(), failed: BTreeSet::new(), last_served: None, report_file }
    }

    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Opens listeners for new pods, drains removed ones, reports the set.
    pub async fn reconcile(&mut self, pods: &NodePods, mesh: &MeshState) {
        let wanted: HashMap<&str, (&str, Option<IpAddr>)> = pods.pods.iter().map(|p| (p.uid.as_str(), (p.netns.as_str(), p.ip))).collect();
        let gone: Vec<String> = self.running.keys().filter(|u| !wanted.contains_key(u.as_str())).cloned().collect();
        for uid in gone {
            if let Some(r) = self.running.remove(&uid) {
                tracing::info!(pod = %uid, open = r.conns.len(), "pod removed: draining its listeners and connections");
                self.shared.pods.remove(r.ip);
                let t = self.shared.config.timeouts.clone();
                tokio::spawn(drain_pod(uid, r, t.drain_grace, t.drain_force));
            }
        }
        self.failed.clear();
        let mut states = BTreeMap::new();
        for (uid, (netns, registered_ip)) in wanted {
            let w = mesh.workload(uid);
            if !self.running.contains_key(uid) {
                // The mesh's address of the pod, else the one it was
                // registered with (a new pod on Kubernetes: its first
                // connection waits for the mesh to name it).
                match w.as_ref().map(|w| w.address()).or(registered_ip) {
                    // Registered before the mesh configuration names it: next time.
                    None => {
                        self.failed.insert(uid.to_string());
                    }
                    Some(ip) => match self.start(uid, ip, Path::new(netns)) {
                        Ok(r) => {
                            tracing::info!(pod = %uid, %ip, netns, known = w.is_some(), "listening in the pod on :15001, :15006, :15008");
                            self.running.insert(uid.to_string(), r);
                        }
                        Err(e) => {
                            tracing::error!(pod = %uid, netns, "cannot open the pod's listeners: {e}");
                            self.failed.insert(uid.to_string());
                        }
                    },
                }
            }
            // Issued ahead of the first connection, so readiness can say
            // the pod is served; renewed in the background from then on.
            if let (Some(w), Some(r)) = (&w, self.running.get(uid)) {
                if !r.cert_requested.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let (certs, id, requested) = (self.shared.certs.clone(), w.identity().clone(), r.cert_requested.clone());
                    tokio::spawn(async move {
                        if let Err(e) = certs.fetch_certificate(&id).await {
                            tracing::warn!(identity = %id, "certificate not issued yet: {e} (asked again at the next change)");
                            requested.store(false, std::sync::atomic::Ordering::SeqCst);
                        }
                    });
                }
            }
            let state = PodState { identity: w.map(|w| w.identity().clone()), listening: self.running.contains_key(uid) };
            states.insert(uid.to_string(), state);
        }
        self.shared.readiness.locked().pods = states;
        self.report();
    }

    fn start(&self, uid: &str, ip: IpAddr, netns: &Path) -> io::Result<Running> {
        let sockets = self.shared.sockets.for_pod(netns, ip)?;
        // All three bound before anything serves.
        let out = sockets.listen(Listener::Outbound)?;
        let plain = sockets.listen(Listener::Plaintext)?;
        let hbone = sockets.listen(Listener::Hbone)?;
        let conns = Arc::new(Conns::default());
        let pod = LocalPod { uid: Arc::from(uid), ip, sockets, limits: self.shared.limits.for_pod(), conns: conns.clone() };
        let (trigger, watch) = drain::channel();
        let server = Server::new(
            hbone,
            self.shared.server_tls.clone(),
            Arc::new(inbound::Certs(self.shared.clone())),
            Arc::new(inbound::HboneHandler { shared: self.shared.clone(), pod: pod.clone() }),
            self.shared.config.server_config(),
        )
        .with_stats(self.shared.telemetry.metrics.hbone.clone());
        tokio::spawn(server.serve(watch.clone()));
        tokio::spawn(accept_loop(out, watch.clone(), {
            let (shared, pod) = (self.shared.clone(), pod.clone());
            move |s, peer| {
                let (shared, pod) = (shared.clone(), pod.clone());
                shard::spawn_accepted(s, move |s| outbound::handle(shared, pod, s, peer));
            }
        }));
        tokio::spawn(accept_loop(plain, watch, {
            let (shared, pod) = (self.shared.clone(), pod.clone());
            move |s, peer| {
                let (shared, pod) = (shared.clone(), pod.clone());
                shard::spawn_accepted(s, move |s| inbound::handle_plaintext(shared, pod, s, peer));
            }
        }));
        self.shared.pods.insert(pod);
        Ok(Running { ip, drain: trigger, conns, cert_requested: Arc::default() })
    }

    fn report(&mut self) {
        let mut uids: Vec<String> = self.running.keys().cloned().collect();
        uids.sort();
        if self.last_served.as_ref() == Some(&uids) {
            return;
        }
        if !self.report_file {
            self.last_served = Some(uids);
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

    /// Drains every pod (see the module's doc), then returns.
    pub async fn drain_all(&mut self) {
        let t = self.shared.config.timeouts.clone();
        let open: usize = self.running.values().map(|r| r.conns.len()).sum();
        tracing::info!(pods = self.running.len(), open, grace = ?t.drain_grace, "draining: listeners closed, open connections may finish");
        let drains: Vec<_> = self.running.drain().map(|(uid, r)| drain_pod(uid, r, t.drain_grace, t.drain_force)).collect();
        let outcomes = futures_util::future::join_all(drains).await;
        let (cancelled, left): (usize, usize) = outcomes.iter().fold((0, 0), |(c, l), o| (c + o.0, l + o.1));
        tracing::info!(closed_at_deadline = cancelled, still_open = left, "drain complete");
    }
}

/// Drains one pod with the drain every proxy uses
/// (`slipstream_hbone::drain`): closed at once, its connections given the
/// grace period, the rest cancelled. Returns how many connections were
/// cancelled at the end of the grace period, and how many were still open
/// after the force period.
async fn drain_pod(uid: String, r: Running, grace: Duration, force: Duration) -> (usize, usize) {
    r.drain.shut(grace);
    let cancelled = r.drain.until_deadline(&*r.conns).await;
    if cancelled > 0 {
        tracing::info!(pod = %uid, cancelled, "drain grace period over: closing the connections still open");
    }
    let drained = r.drain.settle(force, &*r.conns).await;
    (cancelled, drained.left)
}

/// Accepts until the drain starts; each connection goes to `f`.
async fn accept_loop<F>(l: TcpListener, drain: DrainWatch, f: F)
where
    F: Fn(TcpStream, SocketAddr),
{
    loop {
        tokio::select! {
            _ = drain.signaled() => return,
            r = l.accept() => match r {
                Ok((s, peer)) => { f(s, peer); }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
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
    /// the listener, inherited by what it accepts).
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM.nonblocking(), None).unwrap();
        let l = crate::sockets::listen_on(s, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let (_trigger, watch) = drain::channel();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(accept_loop(l, watch, move |s, _| {
            tx.send(s.nodelay().unwrap()).unwrap();
        }));
        let _c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(rx.recv().await, Some(true));
    }
}
