//! A real kube-apiserver and etcd on loopback, for tests of the control plane
//! against the Kubernetes API itself rather than a mock of it.
//!
//! [`KubeTestServer::start`] runs etcd (Debian's `etcd-server`) and a
//! kube-apiserver built from the `k8s.io/kubernetes` Go module by
//! `scripts/kube-apiserver.sh`, each on free loopback ports, with fresh
//! certificates in a temporary directory, and returns once `/readyz` says
//! ok. Dropping it kills both and removes the directory. When either binary
//! is missing, `start` fails with an error that says which and the command
//! that provides it: the tests fail, they never skip.
//!
//! The server, as configured here:
//! - authentication: the kubeconfig's client certificate, user `admin` in
//!   group `system:masters`; service-account tokens signed with a per-server
//!   key, issuer and audience [`API_AUDIENCE`].
//! - authorization: RBAC, as in real clusters. `system:masters` may do
//!   anything; other identities (a service-account token, say) get only what
//!   a test binds to them.
//! - admission: kube-apiserver's default plugins except `ServiceAccount`: no
//!   controller-manager runs to create each namespace's `default` account,
//!   so that plugin would refuse every pod. Pods therefore get no token
//!   volume and may name any `serviceAccountName`.
//! - no controllers, scheduler or kubelets: objects are stored and served,
//!   nothing acts on them (a deleted namespace stays `Terminating`, a pod
//!   runs nowhere unless its `spec.nodeName` says where).
//!
//! Pod-bound service-account tokens (TokenRequest with a `boundObjectRef` to
//! a pod) carry the pod's node: TokenReview returns
//! `authentication.kubernetes.io/node-name` from the pod's `spec.nodeName`,
//! and `authentication.kubernetes.io/node-uid` as well when a Node object of
//! that name exists (feature ServiceAccountTokenPodNodeInfo, GA in 1.32, so
//! no flag). Such a token stops authenticating once its pod is deleted, but
//! not at once: kube-apiserver looks pods up in its informer cache (moments
//! behind etcd), and it caches every successful token authentication for 10
//! seconds (a fixed default, no flag), so a token reviewed just before the
//! deletion passes TokenReview for up to 10 seconds after it. Real clusters
//! behave the same.
#![forbid(unsafe_code)]

mod binaries;
mod pki;
mod process;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use binaries::Binaries;
pub use pki::{ADMIN_GROUP, ADMIN_USER};
use process::Supervised;

/// Each server's directory, in the system's temporary directory.
const DIR_PREFIX: &str = "slipstream-kubetest-";
/// In it, the pid of the test process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// The service-account token issuer, and the audience kube-apiserver
/// accepts tokens for (the names kubeadm gives them).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The range Services get cluster IPs from.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// From the first process started to `/readyz` answering ok. Usually a few
/// seconds; generous because tests share two cores with compilers.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Free ports are found by binding port 0 and letting go, so another process
/// can take one before etcd or kube-apiserver binds it; then start again.
const START_ATTEMPTS: usize = 3;

/// A running etcd and kube-apiserver. Dropping it kills both and removes
/// their directory (certificates, kubeconfig, etcd data, logs).
pub struct KubeTestServer {
    // Fields drop in this order: kube-apiserver before its etcd, both
    // before the directory they write into.
    apiserver: Supervised,
    etcd: Supervised,
    server_url: String,
    ca_pem: String,
    kubeconfig: PathBuf,
    dir: TempDir,
}

/// Process ids, for tests that check nothing outlives the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerPids {
    pub etcd: u32,
    pub apiserver: u32,
}

impl KubeTestServer {
    /// Starts etcd and kube-apiserver and waits until the API server is
    /// ready. Prints which binaries it uses and how long it took.
    pub async fn start() -> anyhow::Result<Self> {
        let binaries = binaries::find()?;
        eprintln!("kubetest: etcd {}", binaries.etcd);
        eprintln!("kubetest: kube-apiserver {}", binaries.apiserver);
        let mut attempt = 1;
        loop {
            match Self::start_with(&binaries).await {
                Err(e) if attempt < START_ATTEMPTS && format!("{e:#}").contains("address already in use") => {
                    eprintln!("kubetest: a port was taken before the server bound it; starting again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_with(binaries: &Binaries) -> anyhow::Result<Self> {
        let started = Instant::now();
        let deadline = started + STARTUP_TIMEOUT;
        sweep_orphaned_dirs();
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir().context("creating the server's directory")?;
        std::fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())?;
        let files = Files::write(dir.path(), &pki::Pki::generate()?)?;
        let [etcd_port, etcd_peer_port, api_port] = free_ports()?;

        let mut etcd =
            Supervised::spawn("etcd", &binaries.etcd.path, &etcd_args(dir.path(), etcd_port, etcd_peer_port), dir.path().join("etcd.log"))?;
        wait_for_etcd(&mut etcd, etcd_port, deadline).await?;
        let args = apiserver_args(dir.path(), &files, etcd_port, api_port);
        let apiserver = Supervised::spawn("kube-apiserver", &binaries.apiserver.path, &args, dir.path().join("kube-apiserver.log"))?;

        let server_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server_url, &files)?;
        let mut server = Self { apiserver, etcd, server_url, ca_pem: files.ca_pem, kubeconfig, dir };
        // On failure `server` drops here: processes killed, directory gone,
        // the log's tail kept in the error.
        server.wait_until_ready(deadline).await?;
        eprintln!(
            "kubetest: kube-apiserver ready at {} in {:.1}s (etcd pid {}, kube-apiserver pid {}, files in {})",
            server.server_url,
            started.elapsed().as_secs_f64(),
            server.etcd.pid(),
            server.apiserver.pid(),
            server.dir.path().display()
        );
        Ok(server)
    }

    /// The kubeconfig of the `admin` user (file paths, not inline data: it is
    /// valid as long as the server lives). For `kubectl --kubeconfig`, or
    /// for a program under test.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The CA that signed the serving certificate and the client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Certificates, kubeconfig, etcd data and the two logs
    /// (`etcd.log`, `kube-apiserver.log`). Removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The key kube-apiserver signs service-account tokens with (PKCS#8 PEM,
    /// ECDSA P-256, so tokens are ES256), for a test that needs a token
    /// TokenRequest will not issue, such as one already expired.
    pub fn service_account_signing_key(&self) -> PathBuf {
        self.dir.path().join("pki").join(SA_KEY_FILE)
    }

    pub fn pids(&self) -> ServerPids {
        ServerPids { etcd: self.etcd.pid(), apiserver: self.apiserver.pid() }
    }

    /// The client configuration of the kubeconfig, for callers that adjust it
    /// (timeouts, impersonation) before building a client.
    pub async fn kube_config(&self) -> anyhow::Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?)
    }

    /// A client acting as `admin` (`system:masters`). Needs a Tokio runtime.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config().await?)?)
    }

    async fn wait_until_ready(&mut self, deadline: Instant) -> anyhow::Result<()> {
        // Through the kubeconfig, so a bad one fails here and not in a test.
        let client = self.client().await.context("building a client from the kubeconfig")?;
        loop {
            self.etcd.check_running().context("etcd died while kube-apiserver was starting")?;
            self.apiserver.check_running().context("kube-apiserver did not start")?;
            let request = http::Request::get("/readyz?verbose").body(Vec::new())?;
            let last = match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
                Ok(Ok(body)) if body.lines().last() == Some("readyz check passed") => return Ok(()),
                Ok(Ok(body)) => body,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "/readyz did not answer within 5s".into(),
            };
            if Instant::now() > deadline {
                anyhow::bail!(
                    "kube-apiserver not ready after {}s; last /readyz answer: {last}{}",
                    STARTUP_TIMEOUT.as_secs(),
                    self.apiserver.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// In the server's `pki` directory: the service-account signing key.
const SA_KEY_FILE: &str = "sa.key";

/// The paths of the PKI files kube-apiserver and the kubeconfig name.
struct Files {
    ca_pem: String,
    ca: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    sa_key: PathBuf,
    sa_public: PathBuf,
}

impl Files {
    fn write(dir: &Path, pki: &pki::Pki) -> anyhow::Result<Self> {
        let pki_dir = dir.join("pki");
        std::fs::create_dir(&pki_dir)?;
        let write = |name: &str, pem: &str| -> anyhow::Result<PathBuf> {
            let path = pki_dir.join(name);
            std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        Ok(Self {
            ca_pem: pki.ca_pem.clone(),
            ca: write("ca.crt", &pki.ca_pem)?,
            serving_cert: write("apiserver.crt", &pki.serving_cert_pem)?,
            serving_key: write("apiserver.key", &pki.serving_key_pem)?,
            admin_cert: write("admin.crt", &pki.admin_cert_pem)?,
            admin_key: write("admin.key", &pki.admin_key_pem)?,
            sa_key: write(SA_KEY_FILE, &pki.sa_key_pem)?,
            sa_public: write("sa.pub", &pki.sa_public_pem)?,
        })
    }
}

/// Removes the directories of test processes that died without dropping
/// their server (killed outright: their etcd and kube-apiserver died with
/// them, see `process`). Each directory names its owner's pid; one without
/// that file yet is being created, and left alone.
fn sweep_orphaned_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for path in entries.filter_map(|e| Some(e.ok()?.path())) {
        if !path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(DIR_PREFIX)) {
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(path.join(OWNER_FILE)) else { continue };
        if !Path::new("/proc").join(owner.trim()).exists() && std::fs::remove_dir_all(&path).is_ok() {
            eprintln!("kubetest: removed {}, left by a test process that was killed (pid {})", path.display(), owner.trim());
        }
    }
}

/// Ports nothing listens on right now: all held at once so they differ.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners: Vec<TcpListener> =
        (0..N).map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).collect::<Result<_, _>>().context("finding a free port")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

fn etcd_args(dir: &Path, client_port: u16, peer_port: u16) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let args = [
        "--name=kubetest".to_string(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=kubetest={peer}"),
        "--initial-cluster-state=new".into(),
        "--logger=zap".into(),
        "--log-outputs=stderr".into(),
    ];
    args.into()
}

fn apiserver_args(dir: &Path, files: &Files, etcd_port: u16, port: u16) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let args = [
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // Without it kube-apiserver looks for a non-loopback interface to
        // advertise, and fails on a machine with only a default route missing.
        "--advertise-address=127.0.0.1".into(),
        // The `kubernetes` Service's endpoints would be the advertised
        // address, and Endpoints refuse loopback addresses: leave them out.
        "--endpoint-reconciler-type=none".into(),
        format!("--cert-dir={}", dir.join("apiserver-certs").display()),
        format!("--tls-cert-file={}", path(&files.serving_cert)),
        format!("--tls-private-key-file={}", path(&files.serving_key)),
        format!("--client-ca-file={}", path(&files.ca)),
        "--authorization-mode=RBAC".into(),
        // See the crate documentation: no controller creates `default`
        // service accounts.
        "--disable-admission-plugins=ServiceAccount".into(),
        // TokenRequest and TokenReview need all four.
        format!("--service-account-issuer={API_AUDIENCE}"),
        format!("--api-audiences={API_AUDIENCE}"),
        format!("--service-account-key-file={}", path(&files.sa_public)),
        format!("--service-account-signing-key-file={}", path(&files.sa_key)),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // The node proxy's DaemonSet is privileged, as on real clusters.
        "--allow-privileged=true".into(),
        "--profiling=false".into(),
    ];
    args.into()
}

fn write_kubeconfig(path: &Path, server_url: &str, files: &Files) -> anyhow::Result<()> {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubetest", "cluster": {"server": server_url, "certificate-authority": files.ca}}],
        "users": [{"name": ADMIN_USER, "user": {"client-certificate": files.admin_cert, "client-key": files.admin_key}}],
        "contexts": [{"name": "kubetest", "context": {"cluster": "kubetest", "user": ADMIN_USER}}],
        "current-context": "kubetest",
    });
    std::fs::write(path, serde_yaml::to_string(&config)?).with_context(|| format!("writing {}", path.display()))
}

/// Waits for etcd's `/health`, so that an etcd that cannot start is
/// reported as such, not as a kube-apiserver that cannot reach it.
async fn wait_for_etcd(etcd: &mut Supervised, port: u16, deadline: Instant) -> anyhow::Result<()> {
    loop {
        etcd.check_running().context("etcd did not start")?;
        if etcd_healthy(port).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("etcd not healthy after {}s{}", STARTUP_TIMEOUT.as_secs(), etcd.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn etcd_healthy(port: u16) -> bool {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer.contains(r#""health":"true""#))
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), ask).await, Ok(Ok(true)))
}
