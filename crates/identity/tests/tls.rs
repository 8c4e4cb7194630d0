//! rustls configurations, exercised over real loopback TCP.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::aws_lc_rs;
use rustls::{CipherSuite, ClientConfig, HandshakeKind, ProtocolVersion, ServerConfig};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::tls::{self, identity_mismatch, ServerTls, UntrustedPeer};
use slipstream_identity::{Ca, SharedTrust, TrustBundle, WorkloadCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

struct Fixture {
    ca: Ca,
    client: WorkloadCert,
    server: WorkloadCert,
    server_tls: ServerTls,
}

fn fixture() -> Fixture {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let client = ca.issue(&id("spiffe://cluster.local/ns/default/sa/sleep"), Duration::from_secs(3600)).unwrap();
    let server = ca.issue(&id("spiffe://cluster.local/ns/default/sa/httpbin"), Duration::from_secs(3600)).unwrap();
    let server_tls = ServerTls::new(ca.roots(), TrustDomain::default()).unwrap();
    Fixture { ca, client, server, server_tls }
}

type ServerResult = Result<Option<SpiffeId>, std::io::Error>;

/// Runs one handshake over loopback. The server echoes one byte and reports
/// the client identity it saw; the client writes and reads one byte so that a
/// TLS 1.3 client-certificate rejection (sent after the client thinks the
/// handshake is done) surfaces on the client too.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> (Result<(SpiffeId, Option<Vec<u8>>, Option<CipherSuite>, HandshakeKind), std::io::Error>, ServerResult) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = TlsAcceptor::from(server).accept(tcp).await?;
        let peer = tls::peer_identity(tls.get_ref().1).ok();
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await?;
        tls.write_all(&b).await?;
        tls.flush().await?;
        Ok(peer)
    });
    let client_result = async {
        let tcp = TcpStream::connect(addr).await?;
        // The name is neither sent nor checked.
        let name = ServerName::IpAddress(addr.ip().into());
        let mut tls = TlsConnector::from(client).connect(name, tcp).await?;
        let conn = tls.get_ref().1;
        let peer = tls::peer_identity(conn).expect("verified server identity");
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
        let kind = conn.handshake_kind().unwrap();
        assert_eq!(conn.protocol_version(), Some(ProtocolVersion::TLSv1_3));
        tls.write_all(b"x").await?;
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await?;
        Ok((peer, alpn, suite, kind))
    }
    .await;
    let server_result = tokio::time::timeout(Duration::from_secs(5), server_task).await.expect("server finished").unwrap();
    (client_result, server_result)
}

#[tokio::test]
async fn mutual_handshake_with_right_identities() {
    let f = fixture();
    let server = f.server_tls.config_for(&f.server).unwrap();
    let client = tls::client_config(&f.client, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let (c, s) = handshake(server, client).await;
    let (server_id, alpn, suite, kind) = c.unwrap();
    assert_eq!(&server_id, f.server.identity());
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(suite, Some(CipherSuite::TLS13_AES_256_GCM_SHA384));
    assert_eq!(kind, HandshakeKind::Full);
    assert_eq!(s.unwrap().as_ref(), Some(f.client.identity()));
}

#[tokio::test]
async fn any_of_several_expected_identities_is_accepted() {
    let f = fixture();
    let server = f.server_tls.config_for(&f.server).unwrap();
    let expected = [id("spiffe://cluster.local/ns/default/sa/waypoint"), f.server.identity().clone()];
    let client = tls::client_config(&f.client, f.ca.roots(), &expected).unwrap();
    let (c, s) = handshake(server, client).await;
    assert!(c.is_ok() && s.is_ok());
}

#[tokio::test]
async fn wrong_server_san_is_an_identity_error() {
    let f = fixture();
    let server = f.server_tls.config_for(&f.server).unwrap();
    let expected = id("spiffe://cluster.local/ns/default/sa/reviews");
    let client = tls::client_config(&f.client, f.ca.roots(), std::slice::from_ref(&expected)).unwrap();
    let (c, s) = handshake(server, client).await;
    let err = c.unwrap_err();
    let mismatch = identity_mismatch(&err).expect("classified as identity mismatch");
    assert_eq!(mismatch.expected, vec![expected]);
    assert_eq!(mismatch.presented, vec![f.server.identity().clone()]);
    assert!(s.is_err());
}

#[tokio::test]
async fn server_from_another_ca_is_a_plain_tls_error() {
    let f = fixture();
    let other = Ca::generate(&TrustDomain::default()).unwrap();
    let impostor = other.issue(f.server.identity(), Duration::from_secs(600)).unwrap();
    let server = f.server_tls.config_for(&impostor).unwrap();
    let client = tls::client_config(&f.client, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let (c, _) = handshake(server, client).await;
    let err = c.unwrap_err();
    assert!(identity_mismatch(&err).is_none(), "untrusted chain is not an identity error: {err}");
}

#[tokio::test]
async fn client_cert_from_another_ca_is_rejected() {
    let f = fixture();
    let other = Ca::generate(&TrustDomain::default()).unwrap();
    let stranger = other.issue(f.client.identity(), Duration::from_secs(600)).unwrap();
    let server = f.server_tls.config_for(&f.server).unwrap();
    // The stranger trusts our roots, so only the server side can refuse.
    let client = tls::client_config(&stranger, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let (c, s) = handshake(server, client).await;
    assert!(s.is_err(), "server must refuse");
    assert!(c.is_err(), "client sees the alert");
}

#[tokio::test]
async fn client_identity_from_another_trust_domain_is_rejected() {
    let f = fixture();
    // Same CA, so the chain is fine; only the trust domain is wrong.
    let foreign = f.ca.issue(&id("spiffe://other.domain/ns/default/sa/sleep"), Duration::from_secs(600)).unwrap();
    let server = f.server_tls.config_for(&f.server).unwrap();
    let client = tls::client_config(&foreign, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let (c, s) = handshake(server, client).await;
    let err = s.unwrap_err();
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))) => {
            let untrusted = o.0.downcast_ref::<UntrustedPeer>().expect("UntrustedPeer");
            assert_eq!(untrusted.trust_domain, TrustDomain::default());
        }
        other => panic!("unexpected server error {other:?} ({err})"),
    }
    assert!(c.is_err());
}

#[tokio::test]
async fn refusing_config_fails_the_handshake() {
    let f = fixture();
    let client = tls::client_config(&f.client, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let (c, s) = handshake(f.server_tls.refusing_config(), client).await;
    assert!(c.is_err() && s.is_err());
}

#[tokio::test]
async fn no_session_resumption() {
    let f = fixture();
    let server = f.server_tls.config_for(&f.server).unwrap();
    let client = tls::client_config(&f.client, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    for _ in 0..2 {
        let (c, _) = handshake(server.clone(), client.clone()).await;
        assert_eq!(c.unwrap().3, HandshakeKind::Full);
    }
}

/// Reads the client's first flight and parses the ClientHello.
#[tokio::test]
async fn client_offers_only_tls13_aes_gcm_h2_and_no_sni() {
    let f = fixture();
    let client = tls::client_config(&f.client, f.ca.roots(), &[f.server.identity().clone()]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dial = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let _ = TlsConnector::from(client).connect(ServerName::try_from("ignored.example").unwrap(), tcp).await;
    });
    let (mut tcp, _) = listener.accept().await.unwrap();
    let mut acceptor = rustls::server::Acceptor::default();
    let accepted = loop {
        let mut buf = vec![0u8; 16 * 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0);
        acceptor.read_tls(&mut &buf[..n]).unwrap();
        if let Some(a) = acceptor.accept().map_err(|(e, _)| e).unwrap() {
            break a;
        }
    };
    let hello = accepted.client_hello();
    let suites: Vec<_> = hello.cipher_suites().iter().copied().filter(|s| *s != CipherSuite::TLS_EMPTY_RENEGOTIATION_INFO_SCSV).collect();
    assert_eq!(suites, vec![CipherSuite::TLS13_AES_256_GCM_SHA384, CipherSuite::TLS13_AES_128_GCM_SHA256]);
    assert_eq!(hello.server_name(), None, "no SNI, even with a DNS name");
    let alpn: Vec<&[u8]> = hello.alpn().unwrap().collect();
    assert_eq!(alpn, vec![&b"h2"[..]]);
    drop(tcp);
    dial.await.unwrap();
}

/// Accepts any server certificate: lets the tests below reach the server's
/// version and suite checks with a non-conforming client.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn nonconforming_client(
    f: &Fixture,
    suites: Vec<rustls::SupportedCipherSuite>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let mut provider = aws_lc_rs::default_provider();
    provider.cipher_suites = suites;
    let provider = Arc::new(provider);
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(f.client.chain().to_vec(), f.client.key().to_der())
        .unwrap();
    Arc::new(config)
}

#[tokio::test]
async fn server_refuses_tls12_and_chacha20() {
    let f = fixture();
    let server = f.server_tls.config_for(&f.server).unwrap();

    let tls12 =
        nonconforming_client(&f, vec![aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384], &[&rustls::version::TLS12]);
    let (c, s) = handshake(server.clone(), tls12).await;
    assert!(c.is_err() && s.is_err(), "TLS 1.2 must be refused");

    let chacha = nonconforming_client(&f, vec![aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256], &[&rustls::version::TLS13]);
    let (c, s) = handshake(server.clone(), chacha).await;
    assert!(c.is_err() && s.is_err(), "ChaCha20 must be refused");

    // Sanity: the same client with an allowed suite gets through.
    let ok = nonconforming_client(&f, vec![aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256], &[&rustls::version::TLS13]);
    let (c, s) = handshake(server, ok).await;
    assert!(s.is_ok());
    assert_eq!(c.unwrap().2, Some(CipherSuite::TLS13_AES_128_GCM_SHA256));
}

#[test]
fn client_config_needs_an_expected_identity() {
    let f = fixture();
    assert!(matches!(tls::client_config(&f.client, f.ca.roots(), &[]), Err(tls::TlsError::NoExpectedIdentity)));
}

/// A server following a shared trust: a client from a new root is refused
/// until the bundle holds that root, then accepted, and the old root's
/// clients still are; replacing the bundle with the same roots is no
/// change.
#[tokio::test]
async fn a_server_following_the_shared_trust_takes_new_roots_at_the_next_handshake() {
    let f = fixture();
    let new = Ca::generate(&TrustDomain::default()).unwrap();
    let newcomer = new.issue(&id("spiffe://cluster.local/ns/default/sa/new"), Duration::from_secs(600)).unwrap();
    let trust = SharedTrust::new(f.ca.roots().clone());
    let server_tls = ServerTls::following(&trust, TrustDomain::default()).unwrap();
    let both = TrustBundle::from_der(f.ca.roots().certs().iter().chain(new.roots().certs()).cloned().collect()).unwrap();
    let expected = [f.server.identity().clone()];

    let config = || server_tls.config_for(&f.server).unwrap();
    let (c, s) = handshake(config(), tls::client_config(&newcomer, &both, &expected).unwrap()).await;
    assert!(c.is_err() && s.is_err(), "a client from the new root is refused while only the old root is trusted");

    assert!(trust.replace(&both));
    assert!(!trust.replace(&both.clone()), "the same roots are no change");
    let (c, s) = handshake(config(), tls::client_config(&newcomer, &both, &expected).unwrap()).await;
    assert_eq!(s.unwrap(), Some(newcomer.identity().clone()));
    c.unwrap();
    let (c, s) = handshake(config(), tls::client_config(&f.client, &both, &expected).unwrap()).await;
    assert_eq!(s.unwrap(), Some(f.client.identity().clone()), "the old root's clients too");
    c.unwrap();
}
