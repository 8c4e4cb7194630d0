//! What the monitor port (`/ready`, `/debug/syncz`, `/debug/resources`)
//! shows: the progress the loops keep, the published resources and the
//! xDS server's proxies.

use super::AbortOnDrop;
use crate::monitor::{self, MonitorSource};
use crate::store::Store;
use crate::syncz::{ProxySync, Syncz, TypeSync};
use crate::xds::XdsServer;
use anyhow::Context;
use slipstream_core::sync::LockExt;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the monitor shows, kept by the loops.
#[derive(Default)]
pub(super) struct Progress {
    /// None until the source has been read whole.
    pub(super) synced: Option<Instant>,
    pub(super) serving: bool,
    pub(super) objects_generation: u64,
    pub(super) generation: u64,
    pub(super) invalid: usize,
}

/// The monitor port's view of the control plane.
pub(super) struct Monitor {
    progress: Arc<Mutex<Progress>>,
    store: Store,
    /// Set once the xDS server exists.
    pub(super) xds: Mutex<Option<XdsServer>>,
    replica: String,
}

/// A lock of the loops' state (`core::sync`'s policy).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

impl MonitorSource for Monitor {
    fn ready(&self) -> Result<(), String> {
        let p = lock(&self.progress);
        match (p.synced, p.serving) {
            (None, _) => Err("the object source has not been read whole yet".into()),
            (Some(_), false) => Err("the control plane port is not serving yet".into()),
            _ => Ok(()),
        }
    }

    fn syncz(&self) -> serde_json::Value {
        let (objects_generation, generation) = {
            let p = lock(&self.progress);
            (p.objects_generation, p.generation)
        };
        let published = self.store.current();
        let proxies = match &*lock(&self.xds) {
            Some(x) => x
                .registry()
                .proxies()
                .into_iter()
                .map(|p| ProxySync {
                    node: p.node,
                    id: p.id,
                    caller: p.caller,
                    peer: p.peer,
                    connected_secs: p.connected_secs,
                    acked_generation: p.acked_generation,
                    types: p
                        .types
                        .into_iter()
                        .map(|t| TypeSync {
                            type_name: t.type_name,
                            sent_nonce: t.sent_nonce,
                            acked_nonce: t.acked_nonce,
                            resources: t.resources,
                            nacks: t.nacks,
                            last_nack: t.last_nack,
                            last_nack_generation: t.last_nack_generation,
                            in_sync: t.in_sync,
                        })
                        .collect(),
                })
                .collect(),
            None => Vec::new(),
        };
        let resources =
            slipstream_api::TypeUrl::ALL.iter().map(|t| (t.short().to_string(), published.count(*t))).collect::<BTreeMap<_, _>>();
        serde_json::to_value(Syncz { replica: self.replica.clone(), objects_generation, generation, resources, proxies })
            .unwrap_or_default()
    }

    fn resources(&self) -> serde_json::Value {
        let published = self.store.current();
        let counts: BTreeMap<&str, usize> = slipstream_api::TypeUrl::ALL.iter().map(|t| (t.short(), published.count(*t))).collect();
        serde_json::json!({"generation": published.generation, "counts": counts, "invalidObjects": lock(&self.progress).invalid})
    }
}

/// The monitor port, bound and served: what it shows, its address and its
/// task.
pub(super) async fn build_monitor(
    addr: SocketAddr,
    store: &Store,
    progress: &Arc<Mutex<Progress>>,
) -> anyhow::Result<(Arc<Monitor>, SocketAddr, AbortOnDrop)> {
    // As istiod: the pod's name from the downward API, else the host name.
    let replica = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_default();
    let mon = Arc::new(Monitor { progress: progress.clone(), store: store.clone(), xds: Mutex::new(None), replica });
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding the monitor port {addr}"))?;
    let local = listener.local_addr()?;
    let task = AbortOnDrop(tokio::spawn(monitor::serve(listener, mon.clone())));
    Ok((mon, local, task))
}
