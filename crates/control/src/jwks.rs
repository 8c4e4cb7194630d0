//! Fetching the JWKS of RequestAuthentications' `jwksUri`, as istiod does
//! by default: the control plane fetches and the waypoints get the key set
//! inline in their routes, so a waypoint never reaches out on a request's
//! behalf.
//!
//! Any tenant who may write a RequestAuthentication names the URL, so the
//! fetch is kept narrow. From inside the cluster only: the URL's host must
//! be a Service of the cluster (`translate::request_authentication`), and
//! the connection goes to that Service's cluster address as the index
//! knows it, never to what a DNS lookup answers, and never to a loopback,
//! link-local (cloud metadata), unspecified or multicast address
//! ([`refused_address`]). Then a plain `GET`, no redirects followed, no
//! credentials sent, at most [`MAX_BODY`] bytes that must be a JWKS and
//! are never logged, and the policy's `timeout` over the whole fetch. A key
//! set that cannot be had is no key set: its rules refuse every token
//! (fail closed), and a later failure keeps the last good one (as istiod's
//! cache does).

use crate::translate::request_authentication::{check_jwks, Fetch};
use http_body_util::{BodyExt, Empty, Limited};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// A JWKS larger than this is refused (the largest public ones are a few KiB).
pub const MAX_BODY: usize = 256 * 1024;

#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// How often a key set is fetched again (istiod: 20 minutes).
    pub refresh: Duration,
    /// The first wait after a failure, doubled each time up to `refresh`.
    pub retry: Duration,
    /// Fetch from loopback too (tests, and a control plane that serves
    /// the keys itself); never on by default.
    pub allow_loopback: bool,
}

impl Default for FetchSettings {
    fn default() -> Self {
        FetchSettings { refresh: Duration::from_secs(20 * 60), retry: Duration::from_secs(1), allow_loopback: false }
    }
}

/// Why a fetch gave no key set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    NoAddress(String),
    #[error("{addr} is an address the control plane does not fetch from (loopback, link-local, unspecified, multicast)")]
    Refused { addr: SocketAddr },
    #[error("connecting to {addr}: {why}")]
    Connect { addr: SocketAddr, why: String },
    #[error("TLS with {host}: {why}")]
    Tls { host: String, why: String },
    #[error("HTTP: {0}")]
    Http(String),
    #[error("answered {status}{}", if *.status >= 300 && *.status < 400 { " (redirects are not followed)" } else { "" })]
    Status { status: u16 },
    #[error("the answer is larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("the answer is not a JWKS: {0}")]
    NotJwks(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Addresses the control plane never fetches from: itself and the node
/// (loopback), link-local (169.254.169.254 is the metadata service of
/// every cloud), unspecified and multicast; IPv4-mapped IPv6 as the IPv4
/// address it maps.
pub fn refused_address(ip: IpAddr, allow_loopback: bool) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    if ip.is_loopback() {
        return !allow_loopback;
    }
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => v6.is_unspecified() || v6.is_multicast() || (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Fetches `f` from `addr` (its Service's cluster address): the JWKS
/// text, checked.
pub async fn fetch(f: &Fetch, addr: SocketAddr, settings: &FetchSettings) -> Result<String, FetchError> {
    if refused_address(addr.ip(), settings.allow_loopback) {
        return Err(FetchError::Refused { addr });
    }
    let body = match tokio::time::timeout(f.timeout, get(f, addr)).await {
        Ok(r) => r?,
        Err(_) => return Err(FetchError::Timeout(f.timeout)),
    };
    let text = String::from_utf8(body).map_err(|_| FetchError::NotJwks("not UTF-8".into()))?;
    check_jwks(&text).map_err(FetchError::NotJwks)?;
    Ok(text)
}

/// One `GET` of `f.url` at `addr`: the body of a 200 answer.
async fn get(f: &Fetch, addr: SocketAddr) -> Result<Vec<u8>, FetchError> {
    let uri: http::Uri = f.url.parse().map_err(|e| FetchError::Http(format!("{:?}: {e}", f.url)))?;
    let host = uri.host().unwrap_or("").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| FetchError::Connect { addr, why: e.to_string() })?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let authority = uri.authority().map(|a| a.as_str().to_string()).unwrap_or_default();
    let request = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, concat!("slipstream-control/", env!("CARGO_PKG_VERSION")))
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| FetchError::Http(e.to_string()))?;
    if f.tls {
        let name =
            rustls_pki_types::ServerName::try_from(host.clone()).map_err(|e| FetchError::Tls { host: host.clone(), why: e.to_string() })?;
        let stream = tokio_rustls::TlsConnector::from(client_config())
            .connect(name, tcp)
            .await
            .map_err(|e| FetchError::Tls { host: host.clone(), why: e.to_string() })?;
        send(stream, request).await
    } else {
        send(tcp, request).await
    }
}

async fn send<S>(stream: S, request: http::Request<Empty<bytes::Bytes>>) -> Result<Vec<u8>, FetchError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| FetchError::Http(e.to_string()))?;
    let conn = tokio::spawn(conn);
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| FetchError::Http(e.to_string()))?;
        if response.status() != http::StatusCode::OK {
            return Err(FetchError::Status { status: response.status().as_u16() });
        }
        let body = Limited::new(response.into_body(), MAX_BODY).collect().await.map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                FetchError::TooLarge
            } else {
                FetchError::Http(e.to_string())
            }
        })?;
        Ok(body.to_bytes().to_vec())
    }
    .await;
    conn.abort();
    result
}

/// The system's roots (the control plane's image carries them), once.
fn client_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!("reading the system's root certificates: {e}");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            tracing::debug!(roots = added, "root certificates for fetching JWKS");
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("aws-lc-rs supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// What to fetch, and from where (or why from nowhere).
pub type Wanted = BTreeMap<Fetch, Result<SocketAddr, String>>;

async fn fetch_from(f: &Fetch, addr: &Result<SocketAddr, String>, settings: &FetchSettings) -> Result<String, FetchError> {
    match addr {
        Ok(a) => fetch(f, *a, settings).await,
        Err(why) => Err(FetchError::NoAddress(why.clone())),
    }
}

/// Fetches everything of `wanted` at once (the control plane's first
/// read): what could be had. Each fetch is given at most `cap` (its own
/// timeout if shorter): a slow issuer does not hold up serving; the task
/// started next tries again.
pub async fn fetch_all(wanted: &Wanted, settings: &FetchSettings, cap: Duration) -> Vec<(Fetch, Option<String>)> {
    let all = wanted.iter().map(|(f, addr)| async move {
        let r = match tokio::time::timeout(cap, fetch_from(f, addr, settings)).await {
            Ok(r) => r,
            Err(_) => Err(FetchError::Timeout(cap)),
        };
        log_result(f, &r);
        (f.clone(), r.ok())
    });
    futures_util::future::join_all(all).await
}

fn log_result(f: &Fetch, r: &Result<String, FetchError>) {
    match r {
        Ok(_) => tracing::info!(url = %f.url, "fetched a JWKS"),
        Err(e) => tracing::warn!(
            url = %f.url,
            "cannot fetch the JWKS: {e}; until it is had, the rules that need it refuse every token (a request without one is not affected)"
        ),
    }
}

/// Keeps every wanted key set fresh: each is fetched when it is first
/// wanted, then every `refresh`, and after a failure again after a
/// growing wait; every new result goes to `results`. Ends when `wanted`'s
/// sender or `results`' receiver is gone.
pub async fn run(
    mut wanted: watch::Receiver<Wanted>,
    results: mpsc::Sender<(Fetch, Option<String>)>,
    settings: FetchSettings,
    mut held: BTreeMap<Fetch, String>,
) {
    // Per fetch: when next, the wait after the next failure, and the
    // address it was planned for (a new one is tried at once: the Service
    // that was missing has come).
    let mut due: BTreeMap<Fetch, (Instant, Duration, Result<SocketAddr, String>)> = BTreeMap::new();
    loop {
        let now = Instant::now();
        let want = wanted.borrow_and_update().clone();
        due.retain(|f, _| want.contains_key(f));
        held.retain(|f, _| want.contains_key(f));
        for (f, addr) in &want {
            match due.get_mut(f) {
                Some(d) if d.2 == *addr => {}
                Some(d) => *d = (now, settings.retry, addr.clone()),
                None => {
                    // One fetched before serving is next due a refresh from now.
                    let at = if held.contains_key(f) { now + settings.refresh } else { now };
                    due.insert(f.clone(), (at, settings.retry, addr.clone()));
                }
            }
        }
        let next = due.values().map(|(at, _, _)| *at).min();
        tokio::select! {
            changed = wanted.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            _ = sleep_until(next) => {}
        }
        let ready: Vec<Fetch> = due.iter().filter(|(_, (at, _, _))| *at <= Instant::now()).map(|(f, _)| f.clone()).collect();
        for f in ready {
            let Some(addr) = want.get(&f) else { continue };
            let r = fetch_from(&f, addr, &settings).await;
            let entry = due.get_mut(&f).expect("kept above");
            match r {
                Ok(text) => {
                    (entry.0, entry.1) = (Instant::now() + settings.refresh, settings.retry);
                    if held.get(&f) != Some(&text) {
                        log_result(&f, &Ok(String::new()));
                        held.insert(f.clone(), text.clone());
                        if results.send((f, Some(text))).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let wait = entry.1;
                    (entry.0, entry.1) = (Instant::now() + wait, (wait * 2).min(settings.refresh));
                    let kept = if held.contains_key(&f) { "; the last good one stays in force" } else { "" };
                    tracing::warn!(url = %f.url, retry_in = ?wait, "cannot fetch the JWKS: {e}{kept}");
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
