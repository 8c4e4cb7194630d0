//! `slipstream waypoint`: the process. Its certificate and its
//! configuration come from the control plane, as a node proxy's do, but
//! authenticated as the workload it is (its own token, so the CA signs its
//! own identity and nothing else); its HBONE server listens on 15008 and
//! its readiness on 15021 (`/healthz/ready`: configuration complete and a
//! certificate in hand).

use crate::{Settings, Waypoint};
use anyhow::Context;
use futures_util::future::BoxFuture;
use slipstream_api::TypeUrl;
use slipstream_core::sync::LockExt;
use slipstream_core::{Change, MeshIndex, SpiffeId, TrustDomain};
use slipstream_hbone::{CertResolver, Pool, PoolConfig, ResolveError, Server, ServerConfig};
use slipstream_identity::tls::ServerTls;
use slipstream_identity::{CertManager, CertManagerConfig, SharedTrust, TrustBundle, WorkloadCert};
use slipstream_proxy::caclient::RemoteCa;
use slipstream_proxy::certs::TrustedCerts;
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use slipstream_proxy::xds::{self, Backoff, NodeInfo, Refusal, Upsert, XdsClient};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The waypoint's flags. Each may come from the environment instead
/// (`SLIPSTREAM_WAYPOINT_<FLAG>`, or the downward-API names a Deployment
/// gives it); the local cluster sets them all.
#[derive(Debug, Clone, clap::Args)]
pub struct WaypointArgs {
    /// The namespace of its Gateway (and pod).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The name of its Gateway, which is also its service account.
    #[arg(long, env = "GATEWAY_NAME")]
    pub gateway: String,
    /// Its pod's address: where it listens, and the source of its tunnels.
    #[arg(long, env = "INSTANCE_IP")]
    pub ip: IpAddr,
    /// The node its pod runs on (its xDS node metadata).
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// The pod's name (its xDS node id).
    #[arg(long, env = "POD_NAME", default_value = "waypoint")]
    pub pod: String,
    /// `host:port` of each control plane replica, comma-separated.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_CONTROL_PLANE", value_delimiter = ',', required = true)]
    pub control_plane: Vec<String>,
    /// The name on the control plane's certificate.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_CONTROL_PLANE_SAN", default_value = slipstream_api::DEFAULT_CONTROL_PLANE_SAN)]
    pub control_plane_san: String,
    /// The mesh root, PEM (the text itself: a pod's /run is its own).
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_ROOT_PEM", hide_env_values = true)]
    pub root_pem: String,
    /// Its bearer token for the control plane, as text (the local
    /// cluster's per-pod token).
    #[arg(
        long,
        env = "SLIPSTREAM_WAYPOINT_TOKEN",
        hide_env_values = true,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// Its bearer token for the control plane, as a file read again at
    /// every connection (Kubernetes: the projected ServiceAccount token,
    /// which the kubelet renews).
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_TRUST_DOMAIN", default_value = slipstream_core::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Runtime threads. 1 (the default) runs everything on one thread:
    /// fewest cross-thread wake-ups per request, at most one core (measured
    /// with `slipstream bench --scenarios l7`: the same latency for less CPU
    /// than 2). More spread tunnels over threads.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// On SIGTERM: for this long the waypoint is not ready but still serves
    /// new tunnels, every HTTP/1 answer closes its connection and HTTP/2
    /// clients are sent GOAWAY, so callers move to another replica between
    /// requests (Istio's `terminationDrainDuration`). Then its listener
    /// closes, idle connections are closed and what is in flight has
    /// `--drain-grace` more. Keep the sum under the pod's grace period.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_DRAIN_DURATION", default_value = "5s", value_parser = slipstream_core::duration::parse_flag)]
    pub drain_duration: Duration,
    /// After `--drain-duration`: how long requests in flight may finish.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_DRAIN_GRACE", default_value = "2s", value_parser = slipstream_core::duration::parse_flag)]
    pub drain_grace: Duration,
    /// Streams (HTTP and TCP connections alike) one client (a pod) may
    /// hold at once; past it a new one is refused 503 (`SOURCE_LIMIT`).
    /// Default: a quarter of the descriptor budget, at most 4096.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_MAX_STREAMS_PER_CLIENT", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_client: Option<u32>,
    /// Mirrored copies of one client's requests in flight; past it a copy
    /// is not sent (the request itself is).
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_MAX_MIRRORS_PER_CLIENT", default_value_t = crate::fair::Fairness::default().client_mirrors)]
    pub max_mirrors_per_client: u32,
    /// The bodies one client may have held for retries and mirrors (of
    /// 64 MiB in all), in MiB; past it its requests are sent once.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_MAX_REPLAY_MIB_PER_CLIENT", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_replay_mib_per_client: u32,
    /// Concurrent requests on one HTTP/2 connection.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_MAX_STREAMS_PER_CONNECTION", default_value_t = crate::fair::Fairness::default().h2_max_streams, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_connection: u32,
    /// A request body that sends nothing for this long before its answer
    /// came is ended with 408.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_REQUEST_BODY_TIMEOUT", default_value = "60s", value_parser = slipstream_core::duration::parse_flag)]
    pub request_body_timeout: Duration,
    /// A connection passed through as TCP that carries nothing either way
    /// for this long is closed.
    #[arg(long, env = "SLIPSTREAM_WAYPOINT_TCP_IDLE_TIMEOUT", default_value = "1h", value_parser = slipstream_core::duration::parse_flag)]
    pub tcp_idle_timeout: Duration,
}

impl WaypointArgs {
    /// The fairness settings the flags give.
    pub fn fairness(&self) -> crate::fair::Fairness {
        crate::fair::Fairness {
            client_streams: self.max_streams_per_client,
            client_mirrors: self.max_mirrors_per_client,
            client_replay_kib: self.max_replay_mib_per_client * 1024,
            request_body_timeout: self.request_body_timeout,
            tcp_idle_timeout: self.tcp_idle_timeout,
            h2_max_streams: self.max_streams_per_connection,
            ..Default::default()
        }
    }
}

/// The waypoint's own certificate, whatever address a tunnel came to.
pub struct OwnCert {
    pub certs: CertManager,
    pub id: SpiffeId,
}

impl CertResolver for OwnCert {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>> {
        Box::pin(async move { self.certs.fetch_certificate(&self.id).await.map_err(|source| ResolveError::Fetch { ip: local_ip, source }) })
    }
}

/// Files only this process reads: the control-plane channel reads its
/// root and token from files (so a rotated one is picked up on the node
/// proxy); here they come from the environment and go into the pod's
/// private temporary directory.
fn private_files(args: &WaypointArgs) -> anyhow::Result<(PathBuf, PathBuf)> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = std::env::temp_dir().join(format!("slipstream-waypoint-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let p = dir.join(name);
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&p)?;
        f.write_all(text.as_bytes())?;
        Ok(p)
    };
    let token = match (&args.token_file, &args.token) {
        (Some(f), _) => f.clone(),
        (None, Some(t)) => write("token", t)?,
        (None, None) => anyhow::bail!("no token: give --token or --token-file"),
    };
    Ok((write("root-cert.pem", &args.root_pem)?, token))
}

pub async fn run(args: WaypointArgs) -> anyhow::Result<()> {
    // As the node proxy: the soft limit up to the hard one, before the
    // per-peer bounds are derived from it (a soft limit of 1 024, common
    // outside systemd, would leave one peer 128 streams).
    match slipstream_proxy::sys::rlimit::raise_nofile() {
        Ok(l) => tracing::debug!(soft = l.soft, "open files limit"),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let td = TrustDomain::new(&args.trust_domain).with_context(|| format!("--trust-domain {:?}", args.trust_domain))?;
    let id: SpiffeId = format!("spiffe://{}/ns/{}/sa/{}", args.trust_domain, args.namespace, args.gateway)
        .parse()
        .with_context(|| format!("waypoint {}/{}: not a valid identity", args.namespace, args.gateway))?;
    let roots = TrustBundle::from_pem(&args.root_pem).context("SLIPSTREAM_WAYPOINT_ROOT_PEM: not a PEM certificate")?;
    let (root_file, token_file) = private_files(&args)?;
    let channel = ControlChannel::new(ControlSettings {
        addresses: args.control_plane.clone(),
        san: args.control_plane_san.clone(),
        root_cert: root_file,
        token_file,
        cluster_id: args.cluster_id.clone(),
        connect_timeout: Duration::from_secs(5),
    })?;
    let trust = SharedTrust::new(roots);
    let certs = CertManager::new(
        Arc::new(RemoteCa::new(channel.clone(), Duration::from_secs(24 * 3600), trust.clone())),
        CertManagerConfig::default(),
    );
    let pool = Pool::new(
        PoolConfig::default(),
        Arc::new(TrustedCerts::new(certs.clone(), trust.clone())),
        Arc::new(slipstream_hbone::PlainConnector),
    );
    let settings = Settings {
        namespace: args.namespace.clone(),
        name: args.gateway.clone(),
        own_ip: args.ip,
        identity: id.clone(),
        idle_timeout: Duration::from_secs(60),
        fairness: args.fairness(),
    };
    let wp = Waypoint::new(settings, pool);

    let listen = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), slipstream_core::HBONE_PORT);
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let tls = ServerTls::following(&trust, td)?;
    let server =
        Server::new(listener, tls, Arc::new(OwnCert { certs: certs.clone(), id: id.clone() }), wp.handler(), ServerConfig::default());
    tokio::spawn(server.serve(wp.drain().watch()));
    // Installed before anything can take traffic: a SIGTERM from then on drains.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let ready = Arc::new(Readiness::default());
    let status = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 15021);
    let status_listener = tokio::net::TcpListener::bind(status).await.with_context(|| format!("binding {status}"))?;
    tokio::spawn(serve_status(status_listener, ready.clone(), None));
    // Istio's request metrics where Istio's proxies serve them.
    let stats = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 15020);
    let stats_listener = tokio::net::TcpListener::bind(stats).await.with_context(|| format!("binding {stats}"))?;
    tokio::spawn(serve_status(stats_listener, ready.clone(), Some(wp.metrics())));
    tracing::info!(identity = %id, hbone = %listen, "waypoint {}/{} starting", args.namespace, args.gateway);

    let node = NodeInfo {
        node_name: args.node.clone(),
        cluster_id: args.cluster_id.clone(),
        ip: args.ip.to_string(),
        pod: args.pod.clone(),
        namespace: args.namespace.clone(),
    };
    let (client, updates) = XdsClient::with_types(channel, &node, Backoff::default(), &TypeUrl::WAYPOINT);
    tokio::spawn(client.run());
    // Configuration keeps arriving while draining.
    let config = tokio::spawn(follow(updates, wp.clone(), certs, id, ready.clone()));
    tokio::select! {
        _ = terminate.recv() => {}
        r = config => {
            r.context("the configuration task")?;
            anyhow::bail!("the control plane's update stream ended");
        }
    }
    ready.draining.store(true, Ordering::Relaxed);
    tracing::info!(
        drain_duration = ?args.drain_duration,
        "SIGTERM: draining: not ready; new tunnels still served; HTTP/1 answers close their connections, HTTP/2 clients sent GOAWAY"
    );
    // The node proxy's drain, with its Closing period: nothing of the
    // waypoint's own to cancel at the deadline (the HBONE server closes
    // its connections then), half a second more for them to go.
    let drain = wp.drain();
    drain.close();
    tokio::time::sleep(args.drain_duration).await;
    drain.shut(args.drain_grace);
    tracing::info!(grace = ?args.drain_grace, "drain duration over: listener closed, idle connections closed, requests in flight may finish");
    drain.until_deadline(&()).await;
    let done = drain.settle(Duration::from_millis(500), &()).await;
    tracing::info!(complete = done.complete, "drained; exiting");
    Ok(())
}

/// Readiness (15021): configuration complete and a certificate in hand,
/// and not draining.
#[derive(Default)]
struct Readiness {
    ready: AtomicBool,
    draining: AtomicBool,
}

impl Readiness {
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }
}

/// Applies the control plane's updates to the waypoint; ready once the
/// whole configuration and a certificate are in hand.
async fn follow(
    mut updates: tokio::sync::mpsc::Receiver<xds::Update>,
    wp: Waypoint,
    certs: CertManager,
    id: SpiffeId,
    ready: Arc<Readiness>,
) {
    let mut index = MeshIndex::default();
    let mut routes = BTreeMap::new();
    let mut settings = slipstream_core::mesh::MeshSettings::default();
    let mut complete = false;
    while let Some(u) = updates.recv().await {
        let refused = apply(&mut index, &mut routes, &mut settings, &u.delta);
        wp.set_mesh(index.snapshot());
        wp.set_routes(routes.values().cloned());
        wp.set_settings(settings);
        complete |= u.delta.complete;
        u.done(refused);
        // Ready with the whole configuration and a certificate in hand:
        // the first caller must not wait for the CA.
        if complete && !ready.ready.load(Ordering::Relaxed) {
            match certs.fetch_certificate(&id).await {
                Ok(_) => {
                    ready.ready.store(true, Ordering::Relaxed);
                    tracing::info!("configuration complete and certificate issued: ready");
                }
                Err(e) => tracing::warn!("configuration complete, but no certificate yet (retried with the next update): {e}"),
            }
        }
    }
}

/// Applies one delta; the resources refused, for the NACK.
fn apply(
    index: &mut MeshIndex,
    routes: &mut BTreeMap<String, slipstream_core::route::ServiceRoutes>,
    settings: &mut slipstream_core::mesh::MeshSettings,
    d: &xds::Delta,
) -> Vec<Refusal> {
    for name in &d.removals {
        match d.type_url {
            TypeUrl::Address => {
                if index.remove_workload(name) == Change::Absent {
                    index.remove_service(name);
                }
            }
            TypeUrl::Authorization => {
                index.remove_policy(name);
            }
            TypeUrl::Route => {
                routes.remove(name);
            }
            // Back to Istio's defaults.
            TypeUrl::Mesh => *settings = Default::default(),
            TypeUrl::NetworkPolicy => {}
        }
    }
    let mut refused = Vec::new();
    for u in &d.upserts {
        let r = match u.clone() {
            Upsert::Workload(w) => index.upsert_workload(w).map(|_| ()),
            Upsert::Service(s) => index.upsert_service(s).map(|_| ()),
            Upsert::Policy(p) => index.upsert_policy(p).map(|_| ()),
            Upsert::NetPolicy(_) => Ok(()),
            Upsert::Routes(r) => {
                routes.insert(r.service.clone(), r);
                Ok(())
            }
            Upsert::Mesh(m) => {
                if *settings != m {
                    tracing::info!(
                        path_normalization = m.path_normalization.as_str(),
                        num_trusted_proxies = m.num_trusted_proxies,
                        "mesh settings from the control plane"
                    );
                }
                *settings = m;
                Ok(())
            }
        };
        if let Err(e) = r {
            refused.push(Refusal { name: e.name.clone(), reason: e.to_string() });
        }
    }
    refused
}

/// The status port (15021): `GET /healthz/ready`, 200 once ready, 503
/// before. The stats port (15020, `metrics` given): `GET
/// /stats/prometheus`, Istio's request metrics. Any pod can reach both: a
/// connection gets 2 s to send its request line, and one address holds at
/// most 4 at once (more are closed at once), so no pod can keep the
/// kubelet's (the agent's) readiness probe out.
async fn serve_status(l: tokio::net::TcpListener, ready: Arc<Readiness>, metrics: Option<Arc<crate::metrics::Metrics>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PER_ADDRESS: u32 = 4;
    let open: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, u32>>> = Arc::default();
    loop {
        let Ok((mut s, peer)) = l.accept().await else { continue };
        {
            let mut o = open.locked();
            let n = o.entry(peer.ip()).or_insert(0);
            if *n >= PER_ADDRESS {
                continue;
            }
            *n += 1;
        }
        let ready = ready.clone();
        let metrics = metrics.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await.ok().and_then(Result::ok).unwrap_or(0);
            let line = std::str::from_utf8(&buf[..n]).unwrap_or("").lines().next().unwrap_or("");
            let path = line.split(' ').nth(1).unwrap_or("");
            let answer = match &metrics {
                Some(m) if path == "/stats/prometheus" || path == "/metrics" => {
                    let body = m.render();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                }
                Some(_) => {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 26\r\nconnection: close\r\n\r\ntry GET /stats/prometheus\n".to_string()
                }
                None if ready.ready() => "HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nready\n".to_string(),
                None if ready.draining.load(Ordering::Relaxed) => {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\nconnection: close\r\n\r\ndraining\n".to_string()
                }
                None => "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\nconnection: close\r\n\r\nnot ready\n".to_string(),
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), s.write_all(answer.as_bytes())).await;
            let mut o = open.locked();
            if let Some(n) = o.get_mut(&peer.ip()) {
                *n -= 1;
                if *n == 0 {
                    o.remove(&peer.ip());
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WaypointArgs,
    }

    fn parse(extra: &[&str]) -> Result<WaypointArgs, clap::Error> {
        let mut argv = vec!["waypoint", "--namespace", "shop", "--gateway", "waypoint", "--ip", "10.0.0.1", "--node", "n1"];
        argv.extend(["--control-plane", "cp:15012", "--root-pem", "PEM"]);
        argv.extend(extra);
        Cli::try_parse_from(argv).map(|c| c.args)
    }

    #[test]
    fn the_token_comes_as_text_or_as_a_file_read_in_place() {
        // Kubernetes: the projected token's file is used as it is, so the
        // kubelet's renewals are picked up.
        let a = parse(&["--token-file", "/var/run/secrets/tokens/istio-token"]).unwrap();
        let (_, token) = private_files(&a).unwrap();
        assert_eq!(token, PathBuf::from("/var/run/secrets/tokens/istio-token"));
        // The local cluster: the text goes into a private file.
        let a = parse(&["--token", "0123456789abcdef"]).unwrap();
        let (_, token) = private_files(&a).unwrap();
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "0123456789abcdef");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);
        // One of them, not both, not neither.
        assert!(parse(&[]).unwrap_err().to_string().contains("--token"));
        assert!(parse(&["--token", "x", "--token-file", "/f"]).is_err());
    }
}
