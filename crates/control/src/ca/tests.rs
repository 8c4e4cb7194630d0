//! The certificate service over real TLS on loopback, called the way a
//! node proxy (ours or ztunnel) calls it: every refusal with its code and
//! message, the chain's shape, operator intermediates, rotation.

use super::placement::ResourcePlacement;
use super::roots::CaMaterial;
use super::service::{CaConfig, CaService};
use super::testing::{serve_tls, Served};
use super::{CallerLimits, Rate};
use crate::auth::NodeTokens;
use crate::resources::{ResourceKey, Resources, Versioned};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use slipstream_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use slipstream_api::ca::IstioCertificateRequest;
use slipstream_api::{TypeUrl, IMPERSONATED_IDENTITY};
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::tls::{client_config, ServerTls};
use slipstream_identity::{generate_csr, Ca, TrustBundle, WorkloadCert};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tonic::Code;

pub(crate) const WEB: &str = "spiffe://cluster.local/ns/default/sa/web";
pub(crate) const DB: &str = "spiffe://cluster.local/ns/default/sa/db";
const TOKEN1: &str = "node1-token-0123456789abcdef";
const TOKEN2: &str = "node2-token-0123456789abcdef";

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

/// web runs on node1, db on node2.
fn resources() -> Resources {
    let mut r = Resources::new();
    for (uid, node, identity) in [("c/Pod/default/web-1", "node1", WEB), ("c/Pod/default/db-1", "node2", DB)] {
        let mut v = Versioned::new(prost_types::Any { type_url: TypeUrl::Address.as_str().into(), value: uid.as_bytes().to_vec() });
        v.node = Some(node.into());
        v.identity = Some(identity.into());
        r.insert(ResourceKey::new(TypeUrl::Address, uid), Arc::new(v));
    }
    r
}

fn tokens() -> NodeTokens {
    NodeTokens::new([("node1".to_string(), TOKEN1.to_string()), ("node2".to_string(), TOKEN2.to_string())].into())
}

struct Fixture {
    served: Served,
    roots: TrustBundle,
}

async fn start(material: CaMaterial, config: CaConfig) -> Fixture {
    let service = CaService::new(config, Arc::new(tokens()), Arc::new(ResourcePlacement::new(resources())), material.clone());
    let served = serve_tls(service, &material.current()).await.unwrap();
    Fixture { served, roots: material.roots() }
}

async fn fixture() -> (Fixture, Arc<Ca>) {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let material = CaMaterial::fixed(ca);
    let current = material.current();
    (start(material, CaConfig::default()).await, current)
}

/// A tonic client that verifies the service's certificate against `roots`
/// and the control plane's name, as a node proxy does.
async fn client(addr: SocketAddr, roots: &TrustBundle) -> IstioCertificateServiceClient<tonic::transport::Channel> {
    let mut tls = rustls::ClientConfig::builder_with_provider(slipstream_identity::tls::provider())
        .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
        .unwrap()
        .with_root_certificates(roots.root_store())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let channel = tonic::transport::Endpoint::from_static("https://istiod.istio-system.svc")
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls_pki_types::ServerName::try_from(slipstream_api::DEFAULT_CONTROL_PLANE_SAN).unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    IstioCertificateServiceClient::new(channel)
}

struct Ask<'a> {
    token: Option<&'a str>,
    csr: String,
    impersonate: Option<&'a str>,
    validity: i64,
}

impl<'a> Ask<'a> {
    fn new(token: &'a str, identity: &'a str) -> (Ask<'a>, slipstream_identity::WorkloadKey) {
        let (csr, key) = generate_csr(&id(identity)).unwrap();
        (Ask { token: Some(token), csr, impersonate: Some(identity), validity: 3600 }, key)
    }

    async fn send(self, c: &mut IstioCertificateServiceClient<tonic::transport::Channel>) -> Result<Vec<String>, tonic::Status> {
        let metadata = self.impersonate.map(|i| slipstream_api::string_struct([(IMPERSONATED_IDENTITY, i)]));
        let mut req = tonic::Request::new(IstioCertificateRequest { csr: self.csr, validity_duration: self.validity, metadata });
        if let Some(t) = self.token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req.metadata_mut().insert("clusterid", "Kubernetes".parse().unwrap());
        c.create_certificate(req).await.map(|r| r.into_inner().cert_chain)
    }
}

fn pem_count(s: &str) -> usize {
    s.matches("-----BEGIN CERTIFICATE-----").count()
}

#[tokio::test]
async fn a_node_gets_its_pods_identity_with_the_chain_in_istio_order() {
    let (f, ca) = fixture().await;
    let mut c = client(f.served.addr, &f.roots).await;
    let (mut ask, key) = Ask::new(TOKEN1, WEB);
    ask.validity = 365 * 24 * 3600;
    let before = SystemTime::now();
    let chain = ask.send(&mut c).await.unwrap();
    assert_eq!(chain.len(), 2, "leaf, then the root bundle");
    assert_eq!(pem_count(&chain[0]), 1);
    assert_eq!(chain[1], ca.roots().to_pem(), "the root bundle is the last element");
    let cert = WorkloadCert::from_istio_chain(&chain, key).unwrap();
    assert_eq!(cert.identity(), &id(WEB));
    // Asked for a year, given the maximum (24 h).
    let lifetime = cert.not_after().duration_since(before).unwrap();
    assert!(lifetime <= Duration::from_secs(24 * 3600 + 2) && lifetime >= Duration::from_secs(24 * 3600 - 2), "{lifetime:?}");
    // No ImpersonatedIdentity: the CSR's identity, still checked against the node.
    let (mut plain, _) = Ask::new(TOKEN1, WEB);
    plain.impersonate = None;
    plain.validity = 0;
    let chain = plain.send(&mut c).await.unwrap();
    assert_eq!(chain.len(), 2);
}

#[tokio::test]
async fn refusals_say_why_with_their_code() {
    let (f, _) = fixture().await;
    let mut c = client(f.served.addr, &f.roots).await;

    let two_sans = {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(WEB.try_into().unwrap()), rcgen::SanType::URI(DB.try_into().unwrap())];
        p.serialize_request(&key).unwrap().pem().unwrap()
    };
    let (other_td_csr, _) = generate_csr(&id("spiffe://evil.example/ns/default/sa/web")).unwrap();

    struct Case<'a> {
        what: &'a str,
        ask: Ask<'a>,
        code: Code,
        message: String,
    }
    let ask = |token: &'static str, identity: &'static str| Ask::new(token, identity).0;
    let cases = vec![
        Case {
            what: "another node's identity",
            ask: ask(TOKEN1, DB),
            code: Code::PermissionDenied,
            message: format!("no pod on node1 runs as {DB}"),
        },
        Case {
            what: "a bad token",
            ask: Ask { token: Some("not-a-token-of-this-cluster"), ..ask(TOKEN1, WEB) },
            code: Code::Unauthenticated,
            message: "the token was refused: not a token of any node of this cluster".into(),
        },
        Case {
            what: "no token",
            ask: Ask { token: None, ..ask(TOKEN1, WEB) },
            code: Code::Unauthenticated,
            message: "no `authorization: Bearer <token>` metadata".into(),
        },
        Case {
            what: "a malformed CSR",
            ask: Ask { csr: "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n".into(), ..ask(TOKEN1, WEB) },
            code: Code::InvalidArgument,
            message: "invalid CSR: malformed PKCS#10 DER".into(),
        },
        Case {
            what: "not PEM at all",
            ask: Ask { csr: "hello".into(), ..ask(TOKEN1, WEB) },
            code: Code::InvalidArgument,
            message: "invalid CSR: no CERTIFICATE REQUEST block in the PEM input".into(),
        },
        Case {
            what: "a CSR for two identities",
            ask: Ask { csr: two_sans, ..ask(TOKEN1, WEB) },
            code: Code::InvalidArgument,
            message: format!("invalid CSR: the CSR asks for 2 identities ([\"{WEB}\", \"{DB}\"]): exactly one is allowed"),
        },
        Case {
            what: "ImpersonatedIdentity differing from the CSR",
            ask: Ask { impersonate: Some(DB), ..ask(TOKEN2, WEB) },
            code: Code::InvalidArgument,
            message: format!("ImpersonatedIdentity {DB} differs from the identity the CSR asks for, {WEB}"),
        },
        Case {
            what: "another trust domain",
            ask: Ask { csr: other_td_csr, impersonate: None, ..ask(TOKEN1, WEB) },
            code: Code::InvalidArgument,
            message: "spiffe://evil.example/ns/default/sa/web is not in the mesh's trust domain cluster.local".into(),
        },
    ];
    for case in cases {
        let status = case.ask.send(&mut c).await.expect_err(case.what);
        assert_eq!(status.code(), case.code, "{}: {}", case.what, status.message());
        assert!(status.message().starts_with(&case.message), "{}: got {:?}, want {:?}", case.what, status.message(), case.message);
        assert!(
            !status.message().contains(TOKEN1) && !status.message().contains("not-a-token"),
            "{}: a credential in the answer",
            case.what
        );
    }
}

#[tokio::test]
async fn one_node_cannot_starve_another() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let config = CaConfig {
        limits: CallerLimits { requests: Rate { burst: 3.0, per_second: 0.001 }, ..CallerLimits::default() },
        ..CaConfig::default()
    };
    let f = start(CaMaterial::fixed(ca), config).await;
    let mut c = client(f.served.addr, &f.roots).await;
    for _ in 0..3 {
        Ask::new(TOKEN1, WEB).0.send(&mut c).await.unwrap();
    }
    let limited = Ask::new(TOKEN1, WEB).0.send(&mut c).await.unwrap_err();
    assert_eq!(limited.code(), Code::ResourceExhausted);
    assert_eq!(limited.message(), "too many certificate requests from node:node1; retry later");
    Ask::new(TOKEN2, DB).0.send(&mut c).await.expect("node2 has its own budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waypoint_pod_at_ten_times_its_budget_does_not_delay_its_nodes_proxy() {
    const WAYPOINT: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
    const WP_TOKEN: &str = "waypoint-token-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workload-tokens.json");
    let entry =
        serde_json::json!({WP_TOKEN: {"namespace": "default", "service_account": "waypoint", "node": "node1", "pod": "waypoint-abc"}});
    std::fs::write(&file, entry.to_string()).unwrap();
    let auth = crate::auth::LocalTokens { nodes: tokens(), workloads: Some(crate::auth::WorkloadTokens::new(&file, "cluster.local")) };
    // A budget of 20 a second: the waypoint asks for 200 in that second.
    let config = CaConfig {
        limits: CallerLimits { requests: Rate { burst: 20.0, per_second: 20.0 }, ..CallerLimits::default() },
        ..CaConfig::default()
    };
    let material = CaMaterial::fixed(Ca::generate(&TrustDomain::default()).unwrap());
    let service = CaService::new(config, Arc::new(auth), Arc::new(ResourcePlacement::new(resources())), material.clone());
    let served = serve_tls(service, &material.current()).await.unwrap();
    let roots = material.roots();
    // 200 requests in one second, 50 at a time: ten times its budget.
    let asks: Vec<Ask<'static>> = (0..200).map(|_| Ask::new(WP_TOKEN, WAYPOINT).0).collect();
    let flood = {
        let c = client(served.addr, &roots).await;
        tokio::spawn(async move {
            let (mut granted, mut limited) = (0, 0);
            let mut asks = asks.into_iter();
            for _ in 0..4 {
                let wave: Vec<_> = asks
                    .by_ref()
                    .take(50)
                    .map(|a| {
                        let mut c = c.clone();
                        async move { a.send(&mut c).await }
                    })
                    .collect();
                for r in futures_util::future::join_all(wave).await {
                    match r {
                        Ok(_) => granted += 1,
                        Err(e) if e.code() == Code::ResourceExhausted => limited += 1,
                        Err(e) => panic!("the waypoint's own identity: {e:?}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (granted, limited)
        })
    };
    // Meanwhile node1's proxy asks for a new pod's identity, again and again.
    let mut c = client(served.addr, &roots).await;
    let mut slowest = Duration::ZERO;
    while !flood.is_finished() {
        let t = std::time::Instant::now();
        Ask::new(TOKEN1, WEB).0.send(&mut c).await.expect("node1's proxy has its own budget");
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (granted, limited) = flood.await.unwrap();
    assert!(limited >= 100, "the waypoint was held to its own budget: {granted} granted, {limited} limited");
    assert!(slowest < Duration::from_millis(100), "node1's proxy waited {slowest:?} for a certificate during the flood");
}

/// Operator material: root -> intermediate (the signing CA).
pub(crate) fn operator_root_and_intermediate(name: &str) -> (rcgen::Certificate, KeyPair, rcgen::Certificate, KeyPair) {
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, format!("{name} root"));
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = rcgen::date_time_ymd(2020, 1, 1);
    p.not_before = now;
    p.not_after = rcgen::date_time_ymd(2090, 1, 1);
    let root = p.self_signed(&root_key).unwrap();
    let int_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, format!("{name} intermediate"));
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = now;
    p.not_after = rcgen::date_time_ymd(2080, 1, 1);
    let intermediate = p.signed_by(&int_key, &root, &root_key).unwrap();
    (root, root_key, intermediate, int_key)
}

#[tokio::test]
async fn an_intermediate_under_the_operators_root() {
    let (root, _, intermediate, int_key) = operator_root_and_intermediate("operator");
    let ca = Ca::from_pem(&intermediate.pem(), &int_key.serialize_pem(), Some(&root.pem())).unwrap();
    let f = start(CaMaterial::fixed(ca), CaConfig::default()).await;
    let mut c = client(f.served.addr, &f.roots).await;
    let (ask, key) = Ask::new(TOKEN1, WEB);
    let chain = ask.send(&mut c).await.unwrap();
    assert_eq!(chain.len(), 3, "leaf, intermediate, root bundle");
    assert_eq!(chain[1], intermediate.pem().replace("\r\n", "\n"));
    assert_eq!(chain[2], TrustBundle::from_pem(&root.pem()).unwrap().to_pem());
    let cert = WorkloadCert::from_istio_chain(&chain, key).unwrap();
    assert_eq!(cert.chain().len(), 2, "the workload presents leaf and intermediate");
    // It verifies against the operator's root alone, as a TLS peer would.
    talk(&cert, &cert, &TrustBundle::from_pem(&root.pem()).unwrap()).await.unwrap();
}

/// One mutual TLS handshake and a byte each way between `client` and
/// `server` (HBONE's configurations), both trusting `roots`.
pub(crate) async fn talk(client: &WorkloadCert, server: &WorkloadCert, roots: &TrustBundle) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server_tls = ServerTls::new(roots, TrustDomain::default()).unwrap().config_for(server).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let accept = tokio::spawn(async move {
        let (tcp, _) = l.accept().await?;
        let mut s = tokio_rustls::TlsAcceptor::from(server_tls).accept(tcp).await?;
        s.write_all(b"s").await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        Ok::<_, std::io::Error>(b[0])
    });
    let cfg = client_config(client, roots, std::slice::from_ref(server.identity())).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut s = tokio_rustls::TlsConnector::from(cfg).connect(rustls_pki_types::ServerName::IpAddress(addr.ip().into()), tcp).await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    s.write_all(b"c").await?;
    s.flush().await?;
    assert_eq!(accept.await.unwrap()?, b'c');
    Ok(())
}

/// A root rotation through the service, as the operator does it: the
/// bundle first (old + new), then the signing certificate. A proxy that
/// renewed during the first step holds an old-root certificate and both
/// roots; one that renews after the second holds a new-root certificate
/// and both roots: they talk both ways. The old root alone does not trust
/// the new certificate.
#[tokio::test]
async fn root_rotation_old_and_new_talk_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let old = Ca::generate(&TrustDomain::default()).unwrap();
    let new = Ca::generate(&TrustDomain::default()).unwrap();
    let (cert, key, bundle) = (dir.path().join("ca-cert.pem"), dir.path().join("ca-key.pem"), dir.path().join("roots.pem"));
    std::fs::write(&cert, old.cert_pem()).unwrap();
    std::fs::write(&key, old.key_pem()).unwrap();
    std::fs::write(&bundle, old.cert_pem()).unwrap();
    let files = super::CaFiles { cert: cert.clone(), key: key.clone(), chain: None, root_bundle: Some(bundle.clone()) };
    let material = CaMaterial::load(&super::CaSource::Files(files), &TrustDomain::default(), Duration::from_secs(3600)).unwrap();
    let f = start(material.clone(), CaConfig::default()).await;
    let mut c = client(f.served.addr, &f.roots).await;

    // Step 1: the bundle holds both roots; the old one still signs.
    std::fs::write(&bundle, format!("{}{}", old.cert_pem(), new.cert_pem())).unwrap();
    assert!(material.reload().unwrap());
    let (ask, k) = Ask::new(TOKEN1, WEB);
    let from_old = WorkloadCert::from_istio_chain(&ask.send(&mut c).await.unwrap(), k).unwrap();
    assert_eq!(from_old.roots().certs().len(), 2, "the proxy learns both roots with its certificate");

    // Step 2: the new root signs.
    std::fs::write(&cert, new.cert_pem()).unwrap();
    std::fs::write(&key, new.key_pem()).unwrap();
    assert!(material.reload().unwrap());
    let (ask, k) = Ask::new(TOKEN2, DB);
    let from_new = WorkloadCert::from_istio_chain(&ask.send(&mut c).await.unwrap(), k).unwrap();
    assert_ne!(from_new.chain()[0], from_old.chain()[0]);

    let both = from_new.roots().clone();
    assert_eq!(&both, from_old.roots());
    talk(&from_old, &from_new, &both).await.expect("old-root client, new-root server");
    talk(&from_new, &from_old, &both).await.expect("new-root client, old-root server");
    assert!(talk(&from_new, &from_old, old.roots()).await.is_err(), "the old root alone does not trust the new certificate");
}
