//! Replicas side by side on a real kube-apiserver and etcd
//! (`slipstream_kubetest`): the CA's Secret created by one and read by the
//! others (`--ca-secret`), a malformed Secret refused and left alone, the
//! roots published for the node proxies (`--root-configmap`), and the
//! leader election on a Lease (`--leader-elect`).
//!
//! The Secret, ConfigMap and Lease are read and written as a service
//! account bound to a Role holding exactly the rules the Helm chart gives
//! the control plane in its namespace: secrets get/create, configmaps
//! get/create/patch, leases get/create/update.
//!
//! Without etcd or kube-apiserver these tests FAIL with a message naming
//! what is missing and how to get it; they never skip. Each test works in
//! a namespace of its own on the API server they share.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use slipstream_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use slipstream_api::ca::IstioCertificateRequest;
use slipstream_control::ca::secret::{self, SecretOrigin};
use slipstream_control::leader::{LeaderSettings, Leadership};
use slipstream_control::namespaced::NamespacedName;
use slipstream_control::run::{start, ControlArgs, Running};
use slipstream_core::TrustDomain;
use slipstream_kubetest::{KubeTestServer, API_AUDIENCE};
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long anything may take to arrive: generous, the machine is shared.
const WAIT: Duration = Duration::from_secs(30);

static SERVER: tokio::sync::Mutex<Weak<KubeTestServer>> = tokio::sync::Mutex::const_new(Weak::new());

/// The API server the tests running now share, started by the first.
async fn api_server() -> Arc<KubeTestServer> {
    let mut slot = SERVER.lock().await;
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let s = Arc::new(KubeTestServer::start().await.expect("a real kube-apiserver and etcd"));
    *slot = Arc::downgrade(&s);
    s
}

fn logs() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,slipstream_control=debug").try_init();
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a well-formed object")
}

/// The control plane's Role in its own namespace, as the chart gives it.
const ROLE_RULES: &str = r#"[
  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
  {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
]"#;

/// Namespace `ns` with the account `slipstream-control` bound to
/// [`ROLE_RULES`] there; a client that is that account.
async fn namespace_with_role(server: &KubeTestServer, ns: &str) -> kube::Client {
    let admin = server.client().await.unwrap();
    let namespace: Namespace = from_json(json!({"metadata": {"name": ns}}));
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &namespace).await.expect("creating a namespace");
    let sa: ServiceAccount = from_json(json!({"metadata": {"name": "slipstream-control"}}));
    Api::<ServiceAccount>::namespaced(admin.clone(), ns).create(&PostParams::default(), &sa).await.expect("creating the account");
    let rules: serde_json::Value = serde_json::from_str(ROLE_RULES).unwrap();
    let rbac = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind), plural)
    };
    let role = DynamicObject::new("slipstream-control", &rbac("Role", "roles")).data(json!({"rules": rules}));
    Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &rbac("Role", "roles"))
        .create(&PostParams::default(), &role)
        .await
        .expect("creating the Role");
    let binding = DynamicObject::new("slipstream-control", &rbac("RoleBinding", "rolebindings")).data(json!({
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "slipstream-control"},
        "subjects": [{"kind": "ServiceAccount", "name": "slipstream-control", "namespace": ns}],
    }));
    Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &rbac("RoleBinding", "rolebindings"))
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the RoleBinding");
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![API_AUDIENCE.into()], expiration_seconds: Some(3600), bound_object_ref: None },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin, ns)
        .create_token_request("slipstream-control", &PostParams::default(), &request)
        .await
        .expect("a TokenRequest")
        .status
        .expect("a TokenRequest's status")
        .token;
    let dir = server.dir().join(format!("as-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, server.ca_pem()).unwrap();
    let kubeconfig: kube::config::Kubeconfig = from_json(json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": {"server": server.server_url(), "certificate-authority": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
    }));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Polls until `done`, or fails naming `what`.
async fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> String {
    String::from_utf8(data.get(key).unwrap_or_else(|| panic!("no key {key}")).0.clone()).unwrap()
}

// ---------------------------------------------------------------------------
// The CA's Secret

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_on_an_absent_secret_end_with_one_root() {
    logs();
    let server = api_server().await;
    let client = namespace_with_role(&server, "race").await;
    let name = NamespacedName::new("race", "slipstream-ca");
    let td = TrustDomain::default();
    let needed = Duration::from_secs(24 * 3600);
    let (a, b, c) = tokio::join!(
        secret::load_or_create(client.clone(), &name, &td, needed),
        secret::load_or_create(client.clone(), &name, &td, needed),
        secret::load_or_create(client.clone(), &name, &td, needed),
    );
    let all = [a.unwrap(), b.unwrap(), c.unwrap()];
    let created = all.iter().filter(|(_, o)| *o == SecretOrigin::Created).count();
    assert_eq!(created, 1, "exactly one creates it: {:?}", all.iter().map(|(_, o)| o).collect::<Vec<_>>());
    assert!(all.iter().all(|(ca, _)| ca.roots() == all[0].0.roots()), "every replica signs under one root");
    let held = Api::<Secret>::namespaced(client.clone(), "race").get("slipstream-ca").await.unwrap().data.unwrap();
    assert_eq!(text(&held, "root-cert.pem"), all[0].0.roots().to_pem().trim_end().to_string() + "\n");
    // Started again, it reads the same one.
    let (again, origin) = secret::load_or_create(client, &name, &td, needed).await.unwrap();
    assert_eq!((again.roots(), origin), (all[0].0.roots(), SecretOrigin::Read));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_secret_is_refused_naming_it_and_left_alone() {
    logs();
    let server = api_server().await;
    let client = namespace_with_role(&server, "malformed").await;
    let admin = server.client().await.unwrap();
    let mut bad: Secret = from_json(json!({"metadata": {"name": "slipstream-ca"}}));
    bad.data = Some(BTreeMap::from([("ca-cert.pem".to_string(), ByteString(b"-----BEGIN CERTIFICATE-----\nnot pem\n".to_vec()))]));
    let secrets = Api::<Secret>::namespaced(admin, "malformed");
    let before = secrets.create(&PostParams::default(), &bad).await.unwrap();

    let name = NamespacedName::new("malformed", "slipstream-ca");
    let e = secret::load_or_create(client, &name, &TrustDomain::default(), Duration::from_secs(3600)).await.unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("Secret malformed/slipstream-ca has no key ca-key.pem"), "{e}");

    let after = secrets.get("slipstream-ca").await.unwrap();
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version, "not changed");
    assert_eq!(after.data, before.data);
}

// ---------------------------------------------------------------------------
// Two control planes

/// `slipstream control --source kubernetes` as the admin, with `extra`.
async fn control_plane(server: &KubeTestServer, dir: &std::path::Path, extra: &[&str]) -> Running {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControlArgs,
    }
    let mut argv: Vec<String> =
        ["control", "--source", "kubernetes", "--listen", "127.0.0.1:0", "--monitor", "127.0.0.1:0"].map(String::from).into();
    argv.extend(["--kubeconfig".into(), server.kubeconfig_path().display().to_string()]);
    argv.extend(["--gateway-controller".into(), "false".into()]);
    argv.extend(extra.iter().map(|a| a.to_string()));
    let _ = dir;
    let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("valid control plane flags");
    start(cli.args).await.expect("the control plane starts")
}

/// A call to `control`'s certificate service over TLS verified against
/// the roots in `roots_file`: refused as unauthenticated (the token is
/// nobody's) once the handshake verified.
async fn handshake_verifies(control: &Running, roots_file: PathBuf, dir: &std::path::Path) -> tonic::Status {
    let token_file = dir.join("token");
    std::fs::write(&token_file, "nobody").unwrap();
    let channel = ControlChannel::new(ControlSettings {
        addresses: vec![control.addr.to_string()],
        san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
        root_cert: roots_file,
        token_file,
        cluster_id: "Kubernetes".into(),
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let req = channel.request(IstioCertificateRequest { csr: String::new(), validity_duration: 3600, metadata: None }).unwrap();
    IstioCertificateServiceClient::new(channel.channel()).create_certificate(req).await.expect_err("no token of anyone's")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_on_one_secret_serve_under_one_root_and_publish_it() {
    logs();
    let server = api_server().await;
    let admin = server.client().await.unwrap();
    let ns: Namespace = from_json(json!({"metadata": {"name": "two-replicas"}}));
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--ca-secret", "two-replicas/slipstream-ca", "--root-configmap", "slipstream-ca-root"];
    let (a, b) = tokio::join!(control_plane(&server, dir.path(), &flags), control_plane(&server, dir.path(), &flags));

    let root =
        text(&Api::<Secret>::namespaced(admin.clone(), "two-replicas").get("slipstream-ca").await.unwrap().data.unwrap(), "root-cert.pem");
    let published = Api::<ConfigMap>::namespaced(admin.clone(), "two-replicas").get("slipstream-ca-root").await.unwrap();
    let published = published.data.unwrap().get("root-cert.pem").cloned().expect("the roots published");
    assert_eq!(published.trim(), root.trim(), "the ConfigMap holds the Secret's root");

    // Both serve certificates issued under that root.
    let roots_file = dir.path().join("published-roots.pem");
    std::fs::write(&roots_file, &published).unwrap();
    for control in [&a, &b] {
        let refused = handshake_verifies(control, roots_file.clone(), dir.path()).await;
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "TLS verified, then the token refused: {refused:?}");
    }

    // A ConfigMap edited by hand is written back when a replica starts.
    let cms = Api::<ConfigMap>::namespaced(admin, "two-replicas");
    cms.patch("slipstream-ca-root", &Default::default(), &kube::api::Patch::Merge(json!({"data": {"root-cert.pem": "stale"}})))
        .await
        .unwrap();
    a.stop().await.unwrap();
    let c = control_plane(&server, dir.path(), &flags).await;
    let now = cms.get("slipstream-ca-root").await.unwrap().data.unwrap()["root-cert.pem"].clone();
    assert_eq!(now, published);
    c.stop().await.unwrap();
    b.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// The leader election

/// Short timings: a lease of 2 s renewed every 300 ms, tried every 200 ms.
fn quick() -> LeaderSettings {
    LeaderSettings::new(Duration::from_secs(2), Duration::from_millis(300), Duration::from_millis(200))
}

async fn holder(client: &kube::Client, ns: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns).get_opt("slipstream-control").await.unwrap()?;
    lease.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_leads_and_another_takes_over_when_it_stops() {
    logs();
    let server = api_server().await;
    let client = namespace_with_role(&server, "elect").await;
    let lease = NamespacedName::new("elect", "slipstream-control");
    let a = Leadership::start(client.clone(), &lease, "replica-a".into(), quick());
    let b = Leadership::start(client.clone(), &lease, "replica-b".into(), quick());
    eventually("one of two leads", WAIT, || a.is_leader() || b.is_leader()).await;
    // And only one, for several renewals.
    for _ in 0..20 {
        assert!(!(a.is_leader() && b.is_leader()), "two leaders");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (leader, follower, leader_name, follower_name) =
        if a.is_leader() { (a, b, "replica-a", "replica-b") } else { (b, a, "replica-b", "replica-a") };
    assert_eq!(holder(&client, "elect").await.as_deref(), Some(leader_name));

    // A clean stop gives the Lease up: the other takes it at its next try.
    leader.release().await;
    let took = eventually("the follower takes over after a release", WAIT, || follower.is_leader()).await;
    assert!(took < Duration::from_secs(2), "within the lease at most: {took:?}");
    assert_eq!(holder(&client, "elect").await.as_deref(), Some(follower_name));

    // A leader that vanishes (its task dropped, nothing released): the
    // next takes over once the lease has run out, not before.
    let c = Leadership::start(client.clone(), &lease, "replica-c".into(), quick());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!c.is_leader(), "the Lease is held");
    let dropped = Instant::now();
    drop(follower);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!c.is_leader(), "taken over before the lease ran out");
    eventually("the next takes over once the lease ran out", WAIT, || c.is_leader()).await;
    let after = dropped.elapsed();
    assert!(after < Duration::from_secs(2) + Duration::from_secs(2), "about the lease's duration: {after:?}");
    assert_eq!(holder(&client, "elect").await.as_deref(), Some("replica-c"));
    c.release().await;
    assert_eq!(holder(&client, "elect").await, None, "released");
}
