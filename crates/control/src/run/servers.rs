//! The :15012 port: the delta xDS server and the certificate service, both
//! behind the one authentication gate, on one TLS listener.

use super::progress::{lock, Monitor};
use super::ControlArgs;
use crate::auth::Authenticator;
use crate::ca::{CaMaterial, CaService, ResourcePlacement, ResourceSource};
use crate::resources::Resources;
use crate::serve::{self, ControlServer, ServeSettings};
use crate::store::Store;
use crate::xds::{XdsServer, XdsSettings};
use slipstream_core::TrustDomain;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The store's current resources, for the CA's placement checks.
struct StoreResources(Store);

impl ResourceSource for StoreResources {
    fn resources(&self) -> Resources {
        self.0.current().resources.clone()
    }
}

/// The port, serving.
pub(super) struct Servers {
    pub(super) xds: XdsServer,
    /// Where it is bound.
    pub(super) addr: SocketAddr,
    /// Ends when the port stops serving.
    pub(super) serving: JoinHandle<anyhow::Result<()>>,
    /// Stops it (connections finish briefly).
    pub(super) stop: tokio::sync::oneshot::Sender<()>,
}

/// Binds :15012 and serves delta xDS from `store` and the certificate
/// service with `material`; the monitor sees the xDS server's proxies.
pub(super) async fn build_servers(
    args: &ControlArgs,
    trust_domain: TrustDomain,
    store: &Store,
    auth: Arc<dyn Authenticator>,
    material: &CaMaterial,
    mon: &Monitor,
) -> anyhow::Result<Servers> {
    let xds_settings = XdsSettings { large_responses_in_flight: args.full_pushes_in_flight, ..Default::default() };
    let xds = XdsServer::with_settings(store.clone(), auth.clone(), xds_settings);
    *lock(&mon.xds) = Some(xds.clone());
    let placement = Arc::new(ResourcePlacement::new(StoreResources(store.clone())));
    let ca_config = args.ca.config(trust_domain);
    let ca = CaService::new(ca_config, auth, placement, material.clone());
    let settings = ServeSettings {
        addr: args.listen,
        names: args.server_names.clone(),
        max_connections_per_peer: args.max_connections_per_peer,
        ..Default::default()
    };
    let server = ControlServer::bind(settings, material.clone()).await?;
    let addr = server.local_addr();
    tracing::info!(%addr, "serving delta xDS and the certificate service");
    let routes = serve::routes(&xds).add_service(ca.into_server());
    let (stop, server_stop) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(routes, async move {
        let _ = server_stop.await;
    }));
    Ok(Servers { xds, addr, serving, stop })
}
