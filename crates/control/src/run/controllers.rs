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
/// `--gateway-controller`) and a template.
pub(super) fn build_gateway_controller(
    args: &ControlArgs,
    material: &CaMaterial,
    client: Option<(kube::Client, Arc<Mirror>)>,
    template: Option<&DeploySettings>,
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
    Some(AbortOnDrop(tokio::spawn(crate::gateway::controller::run(client, mirror, move || ControllerSettings {
        deploy: DeploySettings { root_pem: material.roots().to_pem(), ..template.clone() },
        domain: domain.clone(),
        resync,
    }))))
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
