//! A node proxy fed by a real control plane: the control crate's server
//! on a loopback port (TLS from the mesh CA, per-node tokens, delta xDS),
//! the node's own xDS client over its `ControlChannel`, applied by
//! `NodeProxy::apply_update` as the main loop does. No root.

use slipstream_api::convert::{address_any, authorization_any, AddressResource};
use slipstream_api::TypeUrl;
use slipstream_control::auth::NodeTokens;
use slipstream_control::resources::{Changes, ResourceKey, Resources, Versioned};
use slipstream_control::serve::{routes, ControlServer, ServeSettings};
use slipstream_control::store::Store;
use slipstream_control::xds::XdsServer;
use slipstream_core::policy::{Action, Authorization, Scope};
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_core::*;
use slipstream_identity::Ca;
use slipstream_node::config::Config;
use slipstream_node::proxy::{Deps, NodeProxy};
use slipstream_node::state::Shared;
use slipstream_node::telemetry::Sink;
use slipstream_node::testing::LoopbackFactory;
use slipstream_proxy::config::{LimitArgs, Limits};
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use slipstream_proxy::xds::{Backoff, NodeInfo, XdsClient};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "node1-token-0123456789abcdef";

fn workload(name: &str, ip: [u8; 4]) -> Workload {
    let mut services = BTreeMap::new();
    services.insert(
        "default/echo.default.svc.cluster.local".to_string(),
        vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
    );
    Workload {
        uid: format!("test//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![IpAddr::from(ip)],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: name.into(),
        node: "node1".into(),
        services,
        // The wire's default (an absent capacity reads as 1).
        capacity: 1,
        ..Default::default()
    }
}

fn service() -> Service {
    Service {
        name: "echo".into(),
        namespace: "default".into(),
        hostname: "echo.default.svc.cluster.local".into(),
        addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
        ports: vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
        subject_alt_names: vec![],
        waypoint: None,
    }
}

fn policy() -> Authorization {
    Authorization {
        name: "deny-all".into(),
        namespace: "default".into(),
        scope: Scope::Namespace,
        action: Action::Deny,
        rules: vec![],
        dry_run: false,
    }
}

fn key(t: TypeUrl, name: &str) -> ResourceKey {
    ResourceKey::new(t, name)
}

/// The index's side, played by the test.
struct Index {
    store: Store,
    resources: Resources,
}

impl Index {
    fn new(workloads: &[Workload]) -> Index {
        let mut r = Resources::new();
        for w in workloads {
            r.insert(key(TypeUrl::Address, &w.uid), versioned(address_any(&AddressResource::Workload(w.clone()))));
        }
        r.insert(key(TypeUrl::Address, &service().key()), versioned(address_any(&AddressResource::Service(service()))));
        r.insert(key(TypeUrl::Authorization, &policy().key()), versioned(authorization_any(&policy())));
        Index { store: Store::new(r.clone()), resources: r }
    }

    fn upsert(&mut self, w: &Workload) -> u64 {
        let k = key(TypeUrl::Address, &w.uid);
        self.resources.insert(k.clone(), versioned(address_any(&AddressResource::Workload(w.clone()))));
        self.store.publish(self.resources.clone(), Changes { upserted: vec![k], removed: vec![] })
    }
}

fn versioned(any: prost_types::Any) -> Arc<Versioned> {
    Arc::new(Versioned::new(any))
}

/// A control plane serving `store` on `addr`.
async fn control_plane(addr: SocketAddr, ca: &Arc<Ca>, store: Store) -> (XdsServer, tokio::task::JoinHandle<()>, SocketAddr) {
    let tokens = NodeTokens::new(BTreeMap::from([("node1".to_string(), TOKEN.to_string())]));
    let xds = XdsServer::new(store, Arc::new(tokens));
    let server = ControlServer::bind(ServeSettings { addr, ..Default::default() }, ca.clone()).await.unwrap();
    let bound = server.local_addr();
    let routes = routes(&xds);
    let task = tokio::spawn(async move {
        server.serve(routes, std::future::pending()).await.unwrap();
    });
    (xds, task, bound)
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn has(shared: &Shared, w: &Workload) -> bool {
    shared.snapshot().workload(&w.uid).is_some_and(|m| m.workload() == w)
}

fn loaded(shared: &Shared) -> bool {
    shared.readiness.locked().config_loaded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proxy_follows_the_control_plane_keeps_its_configuration_without_it_and_converges_again() {
    // Shown when the test fails (or with --nocapture).
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info").try_init();
    let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("root.pem"), ca.roots().to_pem()).unwrap();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();

    let (a, b) = (workload("a", [10, 0, 0, 1]), workload("b", [10, 0, 0, 2]));
    let mut index = Index::new(&[a.clone(), b.clone()]);
    let (xds1, server1, addr) = control_plane("127.0.0.1:0".parse().unwrap(), &ca, index.store.clone()).await;

    let mut config = Config::defaults("test", "node1", Limits::derive(4096, &LimitArgs::default()));
    config.admin_addr = "127.0.0.1:0".parse().unwrap();
    config.stats_addr = "127.0.0.1:0".parse().unwrap();
    config.readiness_addr = "127.0.0.1:0".parse().unwrap();
    let settings = ControlSettings {
        addresses: vec![addr.to_string()],
        san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
        root_cert: dir.path().join("root.pem"),
        token_file: dir.path().join("token"),
        cluster_id: "test".into(),
        connect_timeout: Duration::from_secs(2),
    };
    config.control = Some(settings.clone());
    let node = config.node_info();
    let deps = Deps {
        sockets: Arc::new(LoopbackFactory::default()),
        ca: ca.clone().into(),
        sink: Sink::Memory(Mutex::default()),
        report_served: false,
    };
    let mut proxy = NodeProxy::new(config, deps).await.unwrap();
    proxy.serve();
    let shared = proxy.shared().clone();
    assert!(!loaded(&shared));

    let backoff = Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(400) };
    let (client, mut updates) = XdsClient::new(ControlChannel::new(settings).unwrap(), &node, backoff);
    tokio::spawn(client.run());
    // The main loop's part.
    tokio::spawn(async move {
        while let Some(u) = updates.recv().await {
            proxy.apply_update(u).await;
        }
    });

    // The first push: everything, and the configuration counts as loaded.
    wait_for("the first push applied", || loaded(&shared)).await;
    let snap = shared.snapshot();
    assert_eq!(snap.counts(), (2, 1, 1));
    assert!(has(&shared, &a) && has(&shared, &b));
    assert!(snap.service("default/echo.default.svc.cluster.local").is_some());
    assert!(snap.policy("default/deny-all").is_some());
    let reg1 = xds1.registry().clone();
    wait_for("the proxy ACKed the first push", || {
        reg1.proxies().first().is_some_and(|p| p.in_sync() && p.types.len() == TypeUrl::NODE.len())
    })
    .await;
    let p = &reg1.proxies()[0];
    assert_eq!(p.node, "node1");
    assert_eq!(p.id, "ztunnel~0.0.0.0~ztunnel-node1.istio-system~istio-system.svc.cluster.local");

    // A change arrives as a delta.
    let mut a2 = a.clone();
    a2.canonical_revision = "v2".into();
    let generation = index.upsert(&a2);
    reg1.wait_acked(generation, Duration::from_secs(10)).await.expect("ACKed");
    assert!(has(&shared, &a2));

    // A workload the proxy's index refuses (its service account is no
    // SPIFFE segment): NACKed naming the resource and the field; the
    // previous version stays.
    let mut broken = a2.clone();
    broken.service_account = "a?b".into();
    let generation = index.upsert(&broken);
    let report = reg1.wait_acked(generation, Duration::from_secs(10)).await.expect("answered");
    assert_eq!(report.refused.len(), 1, "{report:?}");
    let reason = &report.refused[0].1;
    assert!(reason.contains("test//Pod/default/a") && reason.contains("service_account"), "{reason}");
    assert!(has(&shared, &a2), "the previous version is kept");

    // One without an address (a pod scheduled before the API knows its
    // address) is no error: ACKed, kept off the data path until it has one.
    let mut bare = a2.clone();
    bare.addresses.clear();
    let generation = index.upsert(&bare);
    let report = reg1.wait_acked(generation, Duration::from_secs(10)).await.expect("answered");
    assert!(report.refused.is_empty(), "{report:?}");
    wait_for("the address-less version left the data path", || shared.snapshot().workload(&a2.uid).is_none()).await;
    let generation = index.upsert(&a2);
    reg1.wait_acked(generation, Duration::from_secs(10)).await.expect("ACKed");
    wait_for("back with its address", || has(&shared, &a2)).await;

    // The control plane goes away: the proxy keeps serving what it has.
    server1.abort();
    drop(xds1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(loaded(&shared));
    assert!(has(&shared, &a2) && has(&shared, &b));
    assert_eq!(shared.snapshot().counts(), (2, 1, 1));

    // A new one on the same address, with changes made meanwhile: a fixed,
    // b gone, c new. The proxy converges.
    let mut a3 = a2.clone();
    a3.canonical_revision = "v3".into();
    let c = workload("c", [10, 0, 0, 3]);
    let index2 = Index::new(&[a3.clone(), c.clone()]);
    let (xds2, _server2, _) = control_plane(addr, &ca, index2.store.clone()).await;
    wait_for("the proxy converged on the new control plane", || {
        has(&shared, &a3) && has(&shared, &c) && shared.snapshot().workload(&b.uid).is_none()
    })
    .await;
    assert_eq!(shared.snapshot().counts(), (2, 1, 1));
    let reg2 = xds2.registry().clone();
    wait_for("in sync with the new control plane", || reg2.proxies().first().is_some_and(|p| p.in_sync())).await;
    assert_eq!(reg2.proxies()[0].types[0].resources, 3, "two workloads and the service");
}

/// The root file is read again for each new connection: a control plane
/// whose certificate chains to a root the file did not hold is refused,
/// then reached once the file holds it; a file that does not parse keeps
/// the roots read before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_root_file_is_read_again_for_each_new_connection() {
    use slipstream_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use slipstream_api::discovery::DeltaDiscoveryRequest;
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info").try_init();
    let (old, new) = (Arc::new(Ca::generate(&TrustDomain::default()).unwrap()), Arc::new(Ca::generate(&TrustDomain::default()).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root.pem");
    std::fs::write(&root, old.roots().to_pem()).unwrap();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let index = Index::new(&[workload("a", [10, 0, 0, 1])]);
    // The control plane's certificate is from the new CA only.
    let (_xds, server, addr) = control_plane("127.0.0.1:0".parse().unwrap(), &new, index.store.clone()).await;
    let channel = ControlChannel::new(ControlSettings {
        addresses: vec![addr.to_string()],
        san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
        root_cert: root.clone(),
        token_file: dir.path().join("token"),
        cluster_id: "test".into(),
        connect_timeout: Duration::from_secs(2),
    })
    .unwrap();
    let node = NodeInfo {
        node_name: "node1".into(),
        cluster_id: "test".into(),
        ip: "127.0.0.1".into(),
        pod: "ztunnel-node1".into(),
        namespace: "istio-system".into(),
    };
    // One stream: answered, or how it failed.
    let open = || {
        let channel = channel.clone();
        let first = DeltaDiscoveryRequest { node: Some(node.node()), type_url: TypeUrl::Address.as_str().into(), ..Default::default() };
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(first).await.unwrap();
            let req = channel.request(tokio_stream::wrappers::ReceiverStream::new(rx)).unwrap();
            let mut s = AggregatedDiscoveryServiceClient::new(channel.channel()).delta_aggregated_resources(req).await?.into_inner();
            let r = tokio::time::timeout(Duration::from_secs(10), s.message()).await.expect("an answer in time")?;
            drop(tx);
            Ok::<_, tonic::Status>(r.is_some())
        }
    };
    let e = open().await.expect_err("a certificate from a root the file does not hold");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    // A broken file: still refused (the old root stays), nothing panics.
    std::fs::write(&root, "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n").unwrap();
    assert!(open().await.is_err());

    // Both roots, as during a rotation: the next connection is made.
    std::fs::write(&root, format!("{}{}", old.roots().to_pem(), new.roots().to_pem())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match open().await {
            Ok(answered) => {
                assert!(answered, "the stream answered");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "not connected with the new root in the file: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    server.abort();
}
