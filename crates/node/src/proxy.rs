//! Wiring: what every part of the node proxy shares, and the main loop.

use crate::admin;
use crate::config::Config;
use crate::conn::Telemetry;
use crate::inpod::{InPod, LocalPods};
use crate::watch::{Snapshot, Watcher};
use anyhow::Context;
use slipstream_hbone::{Pool, PoolConfig};
use slipstream_identity::tls::ServerTls;
use slipstream_identity::{Ca, CertManager, CertManagerConfig, LocalCaProvider, TrustDomain};
use std::sync::Arc;
use tokio::sync::watch;

pub struct Shared {
    pub config: Config,
    pub snapshot: watch::Receiver<Snapshot>,
    pub certs: CertManager,
    pub trust_domain: TrustDomain,
    pub server_tls: ServerTls,
    pub pool: Pool,
    pub telemetry: Arc<Telemetry>,
    pub pods: LocalPods,
    pub tracker: Arc<crate::tracker::Tracker>,
    /// Node-wide counters of what each source holds (docs: "Limits").
    pub limits: crate::limits::NodeLimits,
}

pub async fn run(config: Config) -> anyhow::Result<()> {
    // Every proxied connection costs one or two descriptors.
    match crate::sys::rlimit::raise_nofile() {
        Ok(l) => tracing::info!(before = l.before, hard = l.hard, "open-file limit (RLIMIT_NOFILE): {}", l.soft),
        Err(e) => tracing::warn!("cannot raise the open-file limit (RLIMIT_NOFILE): {e}"),
    }
    // Bind before serving: a port conflict fails start-up, not a request.
    let admin_listeners = admin::bind(&config).await?;
    let ca_cert = config.ca_dir.join("root-cert.pem");
    let ca_key = config.ca_dir.join("root-key.pem");
    let ca =
        Ca::from_pem_files(&ca_cert, &ca_key, None).with_context(|| format!("loading the mesh CA from {}", config.ca_dir.display()))?;
    let trust_domain = TrustDomain::new(slipstream_core::DEFAULT_TRUST_DOMAIN)?;
    let server_tls = ServerTls::new(ca.roots(), trust_domain.clone()).context("building the TLS server configuration")?;
    let certs = CertManager::new(Arc::new(LocalCaProvider::new(Arc::new(ca), config.cert_validity)), CertManagerConfig::default());

    let mut watcher = Watcher::new(config.workloads_file(), config.pods_file());
    watcher.poll();
    let (tx, rx) = watch::channel(watcher.current());
    tokio::spawn(watcher.run(tx, config.poll_interval));

    let pods = LocalPods::default();
    let pool = Pool::new(PoolConfig::default(), Arc::new(certs.clone()), Arc::new(pods.connector()));
    let shared = Arc::new(Shared {
        telemetry: Arc::new(Telemetry::new(config.json_access_log, config.limits.refusal_log_burst)),
        limits: crate::limits::NodeLimits::new(&config.limits),
        config,
        snapshot: rx.clone(),
        certs,
        trust_domain,
        server_tls,
        pool,
        pods,
        tracker: Default::default(),
    });
    admin::serve(admin_listeners, shared.clone());
    tokio::spawn(trim_memory(shared.clone()));
    tokio::spawn(summarise_refusals(shared.telemetry.clone()));
    let l = &shared.config.limits;
    tracing::info!(
        budget = l.connection_budget,
        per_pod = l.pod_connections,
        pod_pending = l.pod_pending,
        peer_connections = l.peer_connections,
        peer_handshakes = l.peer_handshakes,
        peer_streams = l.peer_streams,
        peer_plaintext = l.peer_plaintext,
        "connection limits (see /config_dump)"
    );
    tracing::info!(node = %shared.config.node, "node proxy ready");

    let mut inpod = InPod::new(shared.clone());
    let mut rx = rx;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let snap = rx.borrow_and_update().clone();
        inpod.reconcile(&snap).await;
        // Policy changes apply to open connections too.
        let closed = shared.tracker.revoke(|t| crate::authz::authorize(&shared, &t.pod_uid, t.principal.as_deref(), t.src, t.dst));
        if closed > 0 {
            tracing::info!(closed, "open connections closed after a policy change");
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { break },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            // Retry pods whose listeners failed, even without a change.
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)), if inpod.has_failures() => {}
        }
    }
    tracing::info!("draining");
    inpod.drain_all().await;
    Ok(())
}

/// Says, once a second, how many refusal lines each source had suppressed.
async fn summarise_refusals(telemetry: Arc<Telemetry>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        telemetry.summarise_refusals();
    }
}

/// Returns the heap of closed connections to the kernel (see memtrim).
async fn trim_memory(shared: Arc<Shared>) {
    let mut trimmer = crate::memtrim::Trimmer::new(std::time::Instant::now());
    let mut tick = tokio::time::interval(crate::memtrim::CHECK_EVERY);
    loop {
        tick.tick().await;
        if trimmer.due(shared.telemetry.metrics.closed_total(), std::time::Instant::now()) {
            let released = crate::sys::mem::release_free_heap();
            tracing::debug!(released, "trimmed the heap after closed connections");
        }
    }
}
