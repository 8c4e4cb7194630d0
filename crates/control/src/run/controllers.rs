//! What runs beside the index: on Kubernetes the gateway controller (it
//! deploys the waypoints and writes their status), and the fetcher of the
//! RequestAuthentications' key sets.

use super::progress::{lock, Progress};
use super::{AbortOnDrop, ControlArgs, SourceArg, DEFAULT_WAYPOINT_IMAGE};
use crate::ca::CaMaterial;
use crate::gateway::controller::{ControllerSettings, Mirror};
use crate::gateway::render::DeploySettings;
use crate::index::Index;
use crate::store::Store;
use crate::translate::request_authentication::Fetch;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// What a waypoint's pods run on Kubernetes (None elsewhere; the root is
/// added when rendered: it follows rotations). The index admits as a
/// waypoint's pod only one that runs this, whether or not this replica
/// runs the controller that deploys it.
pub(super) fn waypoint_template(args: &ControlArgs) -> anyhow::Result<Option<DeploySettings>> {
    if !matches!(args.source, SourceArg::Kubernetes) {
        return Ok(None);
    }
    Ok(Some(DeploySettings {
        image: args.waypoint_image.clone(),
        control_plane: args.waypoint_control_plane.clone(),
        control_plane_san: args.server_names.first().cloned().unwrap_or_else(|| slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into()),
        root_pem: String::new(),
        trust_domain: args.trust_domain.clone(),
        cluster_id: args.cluster_id.clone(),
        // The waypoints' projected tokens are for the audience the CA
        // reviews tokens for.
        audience: args.ca.review_policy()?.audiences.first().cloned().unwrap_or_else(|| "istio-ca".into()),
    }))
}

/// The gateway controller, when there is a client for it (Kubernetes, with
/// `--gateway-controller`) and a template; with `leading` (leader
/// election), only while this replica leads.
pub(super) fn build_gateway_controller(
    args: &ControlArgs,
    material: &CaMaterial,
    client: Option<(kube::Client, Arc<Mirror>)>,
    template: Option<&DeploySettings>,
    leading: Option<watch::Receiver<bool>>,
) -> Option<AbortOnDrop> {
    let ((client, mirror), template) = client.zip(template.cloned())?;
    let material = material.clone();
    let domain = args.domain_suffix.clone();
    let resync = args.gateway_resync;
    let image = template.image.clone();
    tracing::info!(image = %image, "gateway controller: deploying waypoints, writing Gateway and Service status");
    if image == DEFAULT_WAYPOINT_IMAGE {
        tracing::warn!(
            image = %image,
            "the waypoint image is the default name, which this repository does not publish: build an image with `slipstream` \
             on its PATH and give it with --waypoint-image, or waypoint pods will not start (their Gateways stay Programmed=False)"
        );
    }
    let start = move || {
        let (material, template, domain) = (material.clone(), template.clone(), domain.clone());
        AbortOnDrop(tokio::spawn(crate::gateway::controller::run(client.clone(), mirror.clone(), move || ControllerSettings {
            deploy: DeploySettings { root_pem: material.roots().to_pem(), ..template.clone() },
            domain: domain.clone(),
            resync,
        })))
    };
    match leading {
        None => Some(start()),
        Some(leading) => Some(AbortOnDrop(tokio::spawn(while_leading(leading, start)))),
    }
}

/// Runs what `start` starts while `leading` says this replica leads, and
/// stops it (its task aborted) as soon as it does not; ends when the
/// election ends.
async fn while_leading(mut leading: watch::Receiver<bool>, start: impl Fn() -> AbortOnDrop) {
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        let running = start();
        tracing::info!("gateway controller: started (this replica leads)");
        let ended = leading.wait_for(|l| !*l).await.is_err();
        drop(running);
        tracing::info!("gateway controller: stopped (this replica no longer leads)");
        if ended {
            return;
        }
    }
}

/// The key set fetcher, running.
pub(super) struct Jwks {
    /// What the index wants fetched now.
    pub(super) wanted: watch::Sender<BTreeMap<Fetch, Result<SocketAddr, String>>>,
    /// Each fetch's result.
    pub(super) results: mpsc::Receiver<(Fetch, Option<String>)>,
    pub(super) task: AbortOnDrop,
}

/// Fetches the key sets of the RequestAuthentications in force before
/// serving (at most a few seconds: a slow issuer is retried in the
/// background), so a restarted control plane does not serve routes whose
/// rules refuse every token for want of keys it could have had; then
/// keeps fetching them.
pub(super) async fn build_jwks(args: &ControlArgs, index: &mut Index, store: &Store, progress: &Mutex<Progress>) -> Jwks {
    let settings =
        crate::jwks::FetchSettings { refresh: args.jwks_refresh, allow_loopback: args.jwks_fetch_loopback, ..Default::default() };
    let wanted = index.jwks_fetches();
    let mut held = BTreeMap::new();
    for (f, jwks) in crate::jwks::fetch_all(&wanted, &settings, Duration::from_secs(5)).await {
        if let Some(j) = jwks {
            held.insert(f.clone(), j.clone());
            let changes = index.set_jwks(&f, Some(j));
            lock(progress).generation = store.publish(index.resources().clone(), changes);
        }
    }
    let (wanted, wanted_rx) = watch::channel(wanted);
    let (tx, results) = mpsc::channel(16);
    let task = AbortOnDrop(tokio::spawn(crate::jwks::run(wanted_rx, tx, settings, held)));
    Jwks { wanted, results, task }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The controller runs only while leading: started on each gain,
    /// aborted on each loss, and at the end of the election.
    #[tokio::test]
    async fn the_controller_runs_only_while_leading() {
        let started = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = watch::channel(false);
        let (alive_tx, mut alive) = watch::channel(0usize);
        let alive_tx = Arc::new(alive_tx);
        let count = started.clone();
        let gate = tokio::spawn(while_leading(rx, move || {
            count.fetch_add(1, Ordering::SeqCst);
            let alive_tx = alive_tx.clone();
            AbortOnDrop(tokio::spawn(async move {
                // Counts itself alive while it runs.
                struct Alive(Arc<watch::Sender<usize>>);
                impl Drop for Alive {
                    fn drop(&mut self) {
                        self.0.send_modify(|n| *n -= 1);
                    }
                }
                alive_tx.send_modify(|n| *n += 1);
                let _alive = Alive(alive_tx);
                std::future::pending::<()>().await;
            }))
        }));
        tokio::task::yield_now().await;
        assert_eq!(started.load(Ordering::SeqCst), 0, "not leading: not started");
        for round in 1..=2 {
            tx.send_replace(true);
            alive.wait_for(|n| *n == 1).await.unwrap();
            assert_eq!(started.load(Ordering::SeqCst), round);
            tx.send_replace(false);
            alive.wait_for(|n| *n == 0).await.unwrap();
        }
        tx.send_replace(true);
        alive.wait_for(|n| *n == 1).await.unwrap();
        drop(tx);
        alive.wait_for(|n| *n == 0).await.unwrap();
        gate.await.unwrap();
    }
}
