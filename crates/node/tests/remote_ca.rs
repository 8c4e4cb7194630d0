//! The node proxy with its certificates from the control plane's
//! certificate service (in-process tier, docs/testing.md): two node
//! proxies on loopback, each with its own node token, the service served
//! over TLS as on the control plane's port. The proxies never see a
//! signing key. Then a root rotation, step by step, with connections
//! opened before, during and after it.

use slipstream_control::auth::NodeTokens;
use slipstream_control::ca::testing::{serve_tls, Served};
use slipstream_control::ca::{CaConfig, CaFiles, CaMaterial, CaService, CaSource, ResourcePlacement};
use slipstream_control::resources::{ResourceKey, Resources, Versioned};
use slipstream_core::*;
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::{Ca, CertStatus, CertificateProvider, FetchError, SharedTrust};
use slipstream_node::config::Config;
use slipstream_node::proxy::{Deps, NodeProxy};
use slipstream_node::sockets::Listener;
use slipstream_node::telemetry::Sink;
use slipstream_node::testing::LoopbackFactory;
use slipstream_proxy::caclient::RemoteCa;
use slipstream_proxy::certs::NodeCa;
use slipstream_proxy::config::{LimitArgs, Limits};
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const APP_PORT: u16 = 8080;
const GREETING: &[u8] = b"hi\n";

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after 10s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn spiffe(sa: &str) -> SpiffeId {
    format!("spiffe://cluster.local/ns/default/sa/{sa}").parse().unwrap()
}

fn workload(name: &str, ip: IpAddr, node: &str) -> Workload {
    Workload {
        uid: format!("test//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: name.into(),
        node: node.into(),
        workload_name: name.into(),
        canonical_name: name.into(),
        ..Default::default()
    }
}

/// What the control plane publishes about the same pods: each workload's
/// node and identity.
fn resources(pods: &[(&str, &str)]) -> Resources {
    let mut r = Resources::new();
    for (name, node) in pods {
        let uid = format!("test//Pod/default/{name}");
        let mut v = Versioned::new(prost_types::Any { type_url: slipstream_api::ADDRESS_TYPE_URL.into(), value: uid.as_bytes().to_vec() });
        v.node = Some((*node).into());
        v.identity = Some(spiffe(name).to_string().into());
        r.insert(ResourceKey::new(slipstream_api::TypeUrl::Address, &uid), Arc::new(v));
    }
    r
}

/// The control plane's CA, its files in `dir`, served over TLS.
struct ControlPlane {
    material: CaMaterial,
    served: Served,
    dir: PathBuf,
}

impl ControlPlane {
    async fn start(dir: &Path, root: &Ca, placement: Resources) -> ControlPlane {
        write_ca(dir, root, root, &[root]);
        let files = CaFiles {
            cert: dir.join("ca-cert.pem"),
            key: dir.join("ca-key.pem"),
            chain: None,
            root_bundle: Some(dir.join("root-bundle.pem")),
        };
        let material = CaMaterial::load(&CaSource::Files(files), &TrustDomain::default(), Duration::from_secs(3600)).unwrap();
        let tokens = NodeTokens::new(
            [
                ("node1".to_string(), "token-of-node1-0123456789".to_string()),
                ("node2".to_string(), "token-of-node2-0123456789".to_string()),
            ]
            .into(),
        );
        let service =
            CaService::new(CaConfig::default(), Arc::new(tokens.clone()), Arc::new(ResourcePlacement::new(placement)), material.clone());
        let served = serve_tls(service, &material.current()).await.unwrap();
        // What every node proxy is given: the root (public) and its own token.
        std::fs::write(dir.join("control-plane-root.pem"), root.cert_pem()).unwrap();
        for n in ["node1", "node2"] {
            std::fs::write(dir.join(format!("{n}.token")), format!("token-of-{n}-0123456789\n")).unwrap();
        }
        ControlPlane { material, served, dir: dir.to_path_buf() }
    }

    fn channel(&self, node: &str) -> ControlChannel {
        ControlChannel::new(ControlSettings {
            addresses: vec![self.served.addr.to_string()],
            san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
            root_cert: self.dir.join("control-plane-root.pem"),
            token_file: self.dir.join(format!("{node}.token")),
            cluster_id: "test".into(),
            connect_timeout: Duration::from_secs(5),
        })
        .unwrap()
    }

    /// The operator's step: new files, then the control plane reads them.
    fn rotate(&self, signer: &Ca, bundle: &[&Ca]) {
        write_ca(&self.dir, signer, signer, bundle);
        assert!(self.material.reload().unwrap(), "the new material was taken");
    }
}

fn write_ca(dir: &Path, cert: &Ca, key: &Ca, bundle: &[&Ca]) {
    std::fs::write(dir.join("ca-cert.pem"), cert.cert_pem()).unwrap();
    std::fs::write(dir.join("ca-key.pem"), key.key_pem()).unwrap();
    std::fs::write(dir.join("root-bundle.pem"), bundle.iter().map(|c| c.cert_pem()).collect::<String>()).unwrap();
}

fn config(node: &str, control: &ControlPlane) -> Config {
    let mut c = Config::defaults("test", node, Limits::derive(4096, &LimitArgs::default()));
    c.admin_addr = "127.0.0.1:0".parse().unwrap();
    c.stats_addr = "127.0.0.1:0".parse().unwrap();
    c.readiness_addr = "127.0.0.1:0".parse().unwrap();
    c.timeouts.drain_grace = Duration::from_millis(300);
    c.timeouts.drain_force = Duration::from_millis(500);
    // One HBONE connection per application connection: every connection
    // below makes its own TLS handshake with the trust of its moment.
    c.pool.max_streams_per_connection = 1;
    c.control = Some(control.channel(node).settings().clone());
    c
}

/// A node proxy whose certificates come from `control`, as `run` makes it.
async fn proxy(node: &str, control: &ControlPlane, sockets: &LoopbackFactory) -> NodeProxy {
    let cfg = config(node, control);
    let channel = control.channel(node);
    let ca = cfg.node_ca(Some(&channel)).unwrap();
    assert!(matches!(ca, NodeCa::Remote { .. }), "no local CA with a control plane");
    let deps = Deps { sockets: Arc::new(sockets.clone()), ca, sink: Sink::Memory(Mutex::default()), report_served: false };
    let mut p = NodeProxy::new(cfg, deps).await.unwrap();
    p.serve();
    p
}

/// Pod `a` on node1 and pod `b` on node2, each running the echo app.
struct Mesh {
    a: IpAddr,
    b: IpAddr,
    sockets: LoopbackFactory,
    node1: NodeProxy,
    node2: NodeProxy,
}

impl Mesh {
    async fn new(net: u8, control: &ControlPlane) -> Mesh {
        let (a, b) = (IpAddr::from([127, net, 1, 1]), IpAddr::from([127, net, 2, 1]));
        let sockets = LoopbackFactory::default();
        let (mut node1, mut node2) = (proxy("node1", control, &sockets).await, proxy("node2", control, &sockets).await);
        let mesh = MeshConfig {
            workloads: vec![workload("a", a, "node1"), workload("b", b, "node2")],
            services: vec![],
            policies: vec![],
            net_policies: vec![],
        };
        for ip in [a, b] {
            tokio::spawn(echo(TcpListener::bind(SocketAddr::new(ip, APP_PORT)).await.unwrap()));
        }
        for (n, pod) in [(&mut node1, "a"), (&mut node2, "b")] {
            assert!(n.apply_mesh(&mesh).errors.is_empty());
            n.apply_pods(NodePods {
                pods: vec![PodRegistration { uid: format!("test//Pod/default/{pod}"), netns: String::new(), ip: None }],
            });
            n.reconcile().await;
        }
        let (s1, s2) = (node1.shared().clone(), node2.shared().clone());
        wait_for("both proxies ready (listeners bound, certificates issued)", || s1.ready().is_ok() && s2.ready().is_ok()).await;
        Mesh { a, b, sockets, node1, node2 }
    }

    /// An app connection from `from` to `to`'s echo, through both proxies;
    /// its greeting read.
    async fn connect(&self, from: IpAddr, to: IpAddr) -> std::io::Result<TcpStream> {
        let mut c = self.sockets.connect_captured(from, Listener::Outbound, SocketAddr::new(to, APP_PORT)).await?;
        let mut hi = [0u8; GREETING.len()];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut hi))
            .await
            .map_err(|_| std::io::Error::other("no greeting in time"))??;
        assert_eq!(hi, GREETING);
        Ok(c)
    }

    fn serial(node: &NodeProxy, sa: &str) -> String {
        let id = spiffe(sa);
        node.shared()
            .certs
            .certificates()
            .into_iter()
            .find(|c| c.identity == id)
            .map(|c| match c.status {
                CertStatus::Ready { serial, .. } => serial,
                other => panic!("{sa}: {other:?}"),
            })
            .unwrap_or_else(|| panic!("no certificate for {sa}"))
    }
}

async fn echo(l: TcpListener) {
    loop {
        let Ok((mut s, _)) = l.accept().await else { return };
        tokio::spawn(async move {
            if s.write_all(GREETING).await.is_err() {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

async fn exchange(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got)).await.expect("echo answered in time").unwrap();
    assert_eq!(got, msg);
}

fn roots(t: &SharedTrust) -> usize {
    t.current().certs().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_come_from_the_control_plane_and_carry_the_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let root = Ca::generate(&TrustDomain::default()).unwrap();
    let control = ControlPlane::start(dir.path(), &root, resources(&[("a", "node1"), ("b", "node2")])).await;
    let m = Mesh::new(91, &control).await;

    let mut c = m.connect(m.a, m.b).await.unwrap();
    exchange(&mut c, b"over the mesh").await;
    let mut back = m.connect(m.b, m.a).await.unwrap();
    exchange(&mut back, b"and back").await;
    // Each proxy holds its own pod's certificate (the inbound side) and
    // trusts the control plane's roots.
    assert!(!Mesh::serial(&m.node1, "a").is_empty() && !Mesh::serial(&m.node2, "b").is_empty());
    assert_eq!(m.node1.trust().current(), root.roots().clone());

    // The service refuses node1 the identity of node2's pod, and the
    // client says so.
    let remote = RemoteCa::new(control.channel("node1"), Duration::from_secs(600), SharedTrust::new(root.roots().clone()));
    match remote.fetch(&spiffe("b")).await {
        Err(FetchError::Provider(e)) => {
            let msg = e.to_string();
            assert_eq!(msg, "the control plane refused the certificate (PermissionDenied): no pod on node1 runs as spiffe://cluster.local/ns/default/sa/b");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let ok = remote.fetch(&spiffe("a")).await.unwrap();
    assert_eq!(ok.identity(), &spiffe("a"));
    ok.verify_chain().unwrap();
}

/// The rotation of docs/control-plane.md ("Certificates"), with the
/// renewals forced (a proxy forgets a certificate, its next connection
/// fetches a new one) instead of waited for at half-life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_rotation_keeps_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let old = Ca::generate(&TrustDomain::default()).unwrap();
    let new = Ca::generate(&TrustDomain::default()).unwrap();
    let control = ControlPlane::start(dir.path(), &old, resources(&[("a", "node1"), ("b", "node2")])).await;
    let m = Mesh::new(92, &control).await;

    // Before: everything from the old root.
    let mut before = m.connect(m.a, m.b).await.unwrap();
    exchange(&mut before, b"before").await;
    assert_eq!((roots(m.node1.trust()), roots(m.node2.trust())), (1, 1));

    // Step 1: both roots in the bundle, the old one still signs. node1
    // renews (forced) and learns both roots with its certificate.
    control.rotate(&old, &[&old, &new]);
    let a_old = Mesh::serial(&m.node1, "a");
    m.node1.shared().certs.forget(&spiffe("a"));
    let mut step1 = m.connect(m.a, m.b).await.unwrap();
    exchange(&mut step1, b"step 1").await;
    assert_ne!(Mesh::serial(&m.node1, "a"), a_old, "renewed");
    assert_eq!(roots(m.node1.trust()), 2, "node1 trusts both roots");
    assert_eq!(roots(m.node2.trust()), 1, "node2 has not renewed yet");

    // Step 2: the new root signs. node2 renews: its pod's certificate is
    // from the new root, node1's still from the old one.
    control.rotate(&new, &[&old, &new]);
    m.node2.shared().certs.forget(&spiffe("b"));
    let mut step2 = m.connect(m.a, m.b).await.unwrap();
    exchange(&mut step2, b"old-root client, new-root server").await;
    assert_eq!(roots(m.node2.trust()), 2);
    let mut reverse = m.connect(m.b, m.a).await.unwrap();
    exchange(&mut reverse, b"new-root client, old-root server").await;

    // Step 3: the old root leaves the bundle (once every old certificate
    // has expired; forced here). Both renew: new root only.
    control.rotate(&new, &[&new]);
    m.node1.shared().certs.forget(&spiffe("a"));
    m.node2.shared().certs.forget(&spiffe("b"));
    let mut after = m.connect(m.a, m.b).await.unwrap();
    exchange(&mut after, b"after").await;
    let mut after_back = m.connect(m.b, m.a).await.unwrap();
    exchange(&mut after_back, b"after, back").await;
    assert_eq!((roots(m.node1.trust()), roots(m.node2.trust())), (1, 1));
    assert_eq!(m.node1.trust().current(), new.roots().clone());

    // Nothing established was dropped on the way.
    for (c, what) in [(&mut before, "before"), (&mut step1, "step 1"), (&mut step2, "step 2"), (&mut reverse, "reverse")] {
        exchange(c, format!("still up: {what}").as_bytes()).await;
    }
}
