//! The control plane against a real kube-apiserver and etcd
//! (`slipstream_kubetest`), no mocks: objects made through the API arrive
//! at the node proxy's own xDS client as the workload API's resources, each
//! later change as its delta; the CA and the xDS stream authenticate node
//! proxies with TokenReview against that API server and refuse what they
//! must, with their gRPC codes and messages.
//!
//! Without etcd or kube-apiserver these tests FAIL with a message naming
//! what is missing and how to get it; they never skip. The binaries used,
//! and how they were found, are printed (`--nocapture` shows them on
//! success too).
//!
//! The tests of this file share one API server while they run at the same
//! time (it is dropped, processes and directory, when the last of them
//! ends), so each works in namespaces and on nodes of its own and looks
//! only at its own resources.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use slipstream_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use slipstream_api::ca::IstioCertificateRequest;
use slipstream_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use slipstream_api::discovery::DeltaDiscoveryRequest;
use slipstream_api::{string_struct, TypeUrl, IMPERSONATED_IDENTITY};
use slipstream_control::run::{start, ControlArgs, Running};
use slipstream_core::policy::{Action, Authorization, Scope};
use slipstream_core::SpiffeId;
use slipstream_core::{NetworkAddress, Port, Service as MeshService, TunnelProtocol, Workload, WorkloadStatus, WorkloadType};
use slipstream_identity::{generate_csr, TrustBundle, WorkloadCert};
use slipstream_kubetest::{KubeTestServer, API_AUDIENCE};
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use slipstream_proxy::xds::{Backoff, Delta, NodeInfo, Upsert, XdsClient};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tonic::Code;

/// How long anything may take to arrive: generous, the machine is shared.
const WAIT: Duration = Duration::from_secs(30);
const CLUSTER_ID: &str = "kube-test";
/// The node proxies' account and audience, as the control plane defaults them.
const ZTUNNEL_NS: &str = "istio-system";
const ZTUNNEL_SA: &str = "ztunnel";
const CA_AUDIENCE: &str = "istio-ca";

// ---------------------------------------------------------------------------
// The shared API server

static SERVER: tokio::sync::Mutex<Weak<KubeTestServer>> = tokio::sync::Mutex::const_new(Weak::new());

/// The API server the tests running now share, started by the first.
async fn api_server() -> Arc<KubeTestServer> {
    let mut slot = SERVER.lock().await;
    if let Some(s) = slot.upgrade() {
        eprintln!("kubetest: sharing the kube-apiserver at {}", s.server_url());
        return s;
    }
    // Fails (never skips) when a binary is missing: the error says which
    // and how to get it.
    let s = Arc::new(KubeTestServer::start().await.expect("a real kube-apiserver and etcd"));
    *slot = Arc::downgrade(&s);
    s
}

fn logs() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,slipstream_control=debug").try_init();
}

// ---------------------------------------------------------------------------
// Objects through the API

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a well-formed object")
}

async fn create_namespace(client: &kube::Client, name: &str, labels: serde_json::Value) {
    let ns: Namespace = from_json(json!({"metadata": {"name": name, "labels": labels}}));
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("creating a namespace");
}

async fn create_service_account(client: &kube::Client, ns: &str, name: &str) {
    let sa: ServiceAccount = from_json(json!({"metadata": {"name": name}}));
    Api::<ServiceAccount>::namespaced(client.clone(), ns).create(&PostParams::default(), &sa).await.expect("creating a service account");
}

/// A pod on `node`, then its status as a kubelet would report it: running
/// at `ip` and ready (when `ip` is given).
async fn create_pod(client: &kube::Client, ns: &str, name: &str, node: &str, sa: &str, labels: serde_json::Value, ip: Option<&str>) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pod: Pod = from_json(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            "containers": [{
                "name": "app",
                "image": "example.invalid/app:1",
                "ports": [{"name": "http-alt", "containerPort": 8080, "protocol": "TCP"}],
            }],
        },
    }));
    let created = pods.create(&PostParams::default(), &pod).await.expect("creating a pod");
    match ip {
        Some(ip) => set_status(client, ns, name, ip, true).await,
        None => created,
    }
}

/// The ReplicaSet the deployment controller would make for `d` (its
/// template, owned by it).
async fn replica_set_of(client: &kube::Client, d: &k8s_openapi::api::apps::v1::Deployment) -> k8s_openapi::api::apps::v1::ReplicaSet {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    let ns = d.metadata.namespace.clone().unwrap();
    let name = d.metadata.name.clone().unwrap();
    let spec = d.spec.clone().unwrap();
    let mut template = spec.template.clone();
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert("pod-template-hash".into(), "7d9f".into());
    let rs: ReplicaSet = from_json(json!({
        "metadata": {"name": format!("{name}-7d9f"), "labels": template.metadata.as_ref().unwrap().labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": d.metadata.uid, "controller": true}]},
        "spec": {"replicas": 1, "selector": spec.selector, "template": template},
    }));
    Api::<ReplicaSet>::namespaced(client.clone(), &ns).create(&PostParams::default(), &rs).await.expect("creating a ReplicaSet")
}

/// A pod as the ReplicaSet controller makes it from `rs` (its template's
/// labels and spec, owned by it), `change`d, then scheduled on `wp-node`
/// and reported ready at `ip` as a kubelet would.
async fn pod_of(
    client: &kube::Client,
    rs: &k8s_openapi::api::apps::v1::ReplicaSet,
    name: &str,
    ip: &str,
    change: impl FnOnce(&mut serde_json::Value),
) -> Pod {
    let ns = rs.metadata.namespace.clone().unwrap();
    let template = rs.spec.as_ref().unwrap().template.clone().unwrap();
    let mut spec = serde_json::to_value(template.spec.unwrap()).unwrap();
    spec["nodeName"] = json!("wp-node");
    change(&mut spec);
    let pod: Pod = from_json(json!({
        "metadata": {"name": name, "labels": template.metadata.unwrap().labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.metadata.name, "uid": rs.metadata.uid, "controller": true}]},
        "spec": spec,
    }));
    Api::<Pod>::namespaced(client.clone(), &ns).create(&PostParams::default(), &pod).await.expect("creating a pod");
    set_status(client, &ns, name, ip, true).await
}

/// The status subresource: what the kubelet writes.
async fn set_status(client: &kube::Client, ns: &str, name: &str, ip: &str, ready: bool) -> Pod {
    let ready = if ready { "True" } else { "False" };
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.0.2.1",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready}],
    }});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("setting a pod's status")
}

fn istio_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("security.istio.io", "v1", kind), plural)
}

/// The two `security.istio.io/v1` kinds, namespaced, with a schema that
/// keeps every field (the control plane validates them itself); returns
/// once the API server serves them.
async fn install_istio_crds(client: &kube::Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for (kind, plural) in [("AuthorizationPolicy", "authorizationpolicies"), ("PeerAuthentication", "peerauthentications")] {
        let name = format!("{plural}.security.istio.io");
        let crd: CustomResourceDefinition = from_json(json!({
            "metadata": {"name": name},
            "spec": {
                "group": "security.istio.io",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        }));
        crds.create(&PostParams::default(), &crd).await.expect("creating a CRD");
        let deadline = Instant::now() + WAIT;
        loop {
            let got = crds.get(&name).await.expect("reading a CRD");
            let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
                break;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established after {WAIT:?}: {conditions:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn istio_crds_installed(client: &kube::Client) -> bool {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt("authorizationpolicies.security.istio.io")
        .await
        .expect("reading CRDs")
        .is_some()
}

async fn create_istio_object(client: &kube::Client, kind: &str, plural: &str, ns: &str, name: &str, spec: serde_json::Value) {
    let ar = istio_resource(kind, plural);
    let obj = DynamicObject::new(name, &ar).within(ns).data(json!({ "spec": spec }));
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .create(&PostParams::default(), &obj)
        .await
        .expect("creating a custom resource");
}

// ---------------------------------------------------------------------------
// The control plane in this process

struct ControlPlane {
    running: Option<Running>,
    dir: tempfile::TempDir,
    /// From `start` called to the port serving.
    started_in: Duration,
}

impl ControlPlane {
    /// `slipstream control --source kubernetes` against `server`; with
    /// `node_tokens`, callers are the local cluster's nodes, else node
    /// proxies checked by TokenReview.
    /// Without the gateway controller: the tests share one API server, and
    /// only the test of the controller runs one (two with different
    /// settings would undo each other's writes).
    async fn start(server: &KubeTestServer, node_tokens: Option<&BTreeMap<&str, &str>>) -> ControlPlane {
        Self::start_with(server, node_tokens, &["--gateway-controller", "false"]).await
    }

    /// [`start`](Self::start) with more flags.
    async fn start_with(server: &KubeTestServer, node_tokens: Option<&BTreeMap<&str, &str>>, extra: &[&str]) -> ControlPlane {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ControlArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let mut argv: Vec<String> =
            ["control", "--source", "kubernetes", "--listen", "127.0.0.1:0", "--monitor", "127.0.0.1:0", "--cluster-id", CLUSTER_ID]
                .map(String::from)
                .into();
        if !extra.contains(&"--kubeconfig") {
            argv.extend(["--kubeconfig".into(), server.kubeconfig_path().display().to_string()]);
        }
        argv.extend(["--ca-dir".into(), dir.path().join("ca").display().to_string()]);
        if let Some(tokens) = node_tokens {
            let path = dir.path().join("node-tokens.json");
            std::fs::write(&path, serde_json::to_string(tokens).unwrap()).unwrap();
            argv.extend(["--node-tokens".into(), path.display().to_string()]);
        }
        argv.extend(extra.iter().map(|a| a.to_string()));
        let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("valid control plane flags");
        let started = Instant::now();
        let running = start(cli.args).await.expect("the control plane starts");
        let started_in = started.elapsed();
        eprintln!("control plane serving at {} after {:.1}s", running.addr, started_in.as_secs_f64());
        ControlPlane { running: Some(running), dir, started_in }
    }

    fn root_cert(&self) -> PathBuf {
        self.dir.path().join("ca").join("root-cert.pem")
    }

    fn roots_pem(&self) -> String {
        TrustBundle::from_pem_file(&self.root_cert()).expect("the generated root").to_pem()
    }

    /// The node proxy's channel to :15012 (TLS verified against the mesh
    /// root); its token file is `token` written to disk.
    fn channel(&self, token: &str) -> ControlChannel {
        let name = format!("token-{}", next_id());
        let token_file = self.dir.path().join(name);
        std::fs::write(&token_file, token).unwrap();
        ControlChannel::new(ControlSettings {
            addresses: vec![self.running.as_ref().unwrap().addr.to_string()],
            san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
            root_cert: self.root_cert(),
            token_file,
            cluster_id: CLUSTER_ID.into(),
            connect_timeout: Duration::from_secs(5),
        })
        .expect("a channel to the control plane")
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await.expect("the control plane stops cleanly");
        }
    }
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// The xDS client: the node proxy's own, its deltas applied to a map

/// What a node proxy holds, by resource name.
#[derive(Default, Debug)]
struct Held {
    workloads: BTreeMap<String, Workload>,
    services: BTreeMap<String, MeshService>,
    policies: BTreeMap<String, Authorization>,
    net_policies: BTreeMap<String, slipstream_core::policy::network::NetPolicy>,
    mesh: Option<slipstream_core::mesh::MeshSettings>,
}

impl Held {
    fn apply(&mut self, d: &Delta) {
        for name in &d.removals {
            match d.type_url {
                TypeUrl::Address => {
                    self.workloads.remove(name);
                    self.services.remove(name);
                }
                TypeUrl::Authorization => {
                    self.policies.remove(name);
                }
                TypeUrl::NetworkPolicy => {
                    self.net_policies.remove(name);
                }
                TypeUrl::Mesh => self.mesh = None,
                TypeUrl::Route => {}
            }
        }
        for u in &d.upserts {
            match u {
                Upsert::Workload(w) => {
                    self.workloads.insert(w.uid.clone(), w.clone());
                }
                Upsert::Service(s) => {
                    self.services.insert(s.key(), s.clone());
                }
                Upsert::Policy(p) => {
                    self.policies.insert(p.key(), p.clone());
                }
                Upsert::NetPolicy(p) => {
                    self.net_policies.insert(p.key(), p.clone());
                }
                Upsert::Mesh(m) => self.mesh = Some(*m),
                Upsert::Routes(_) => {}
            }
        }
    }

    fn workload(&self, ns: &str, name: &str) -> Option<&Workload> {
        self.workloads.get(&uid(ns, name))
    }
}

fn uid(ns: &str, name: &str) -> String {
    format!("{CLUSTER_ID}//Pod/{ns}/{name}")
}

/// The names one delta touches (upserted or removed).
fn names(d: &Delta) -> Vec<String> {
    let mut out: Vec<String> = d
        .upserts
        .iter()
        .map(|u| match u {
            Upsert::Workload(w) => w.uid.clone(),
            Upsert::Service(s) => s.key(),
            Upsert::Policy(p) => p.key(),
            Upsert::NetPolicy(p) => p.key(),
            Upsert::Routes(r) => r.service.clone(),
            Upsert::Mesh(_) => slipstream_api::MESH_RESOURCE.to_string(),
        })
        .chain(d.removals.iter().cloned())
        .collect();
    out.sort();
    out
}

/// A node proxy's xDS client on its own tasks; every delta is applied to
/// `held` and ACKed.
struct Proxy {
    held: Held,
    deltas: mpsc::UnboundedReceiver<Delta>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    fn connect(channel: ControlChannel, node: &str) -> Proxy {
        Self::connect_for(channel, node, &TypeUrl::NODE)
    }

    /// A client of `types` (a waypoint's: [`TypeUrl::WAYPOINT`]).
    fn connect_for(channel: ControlChannel, node: &str, types: &[TypeUrl]) -> Proxy {
        let info = NodeInfo {
            node_name: node.into(),
            cluster_id: CLUSTER_ID.into(),
            ip: "192.0.2.1".into(),
            pod: format!("ztunnel-{node}"),
            namespace: ZTUNNEL_NS.into(),
        };
        let (client, mut updates) =
            XdsClient::with_types(channel, &info, Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) }, types);
        let (tx, deltas) = mpsc::unbounded_channel();
        let forward = tokio::spawn(async move {
            while let Some(u) = updates.recv().await {
                let d = u.delta.clone();
                u.done(vec![]);
                if tx.send(d).is_err() {
                    return;
                }
            }
        });
        Proxy { held: Held::default(), deltas, tasks: vec![tokio::spawn(client.run()), forward] }
    }

    /// Applies deltas until `done` holds; the deltas applied meanwhile.
    async fn until(&mut self, what: &str, done: impl Fn(&Held) -> bool) -> Vec<Delta> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while !done(&self.held) {
            match tokio::time::timeout_at(deadline, self.deltas.recv()).await {
                Ok(Some(d)) => {
                    self.held.apply(&d);
                    seen.push(d);
                }
                Ok(None) => panic!("the xDS client stopped while waiting for: {what}"),
                Err(_) => {
                    panic!("timed out after {WAIT:?} waiting for: {what}\nthe proxy holds: {:#?}\ndeltas meanwhile: {seen:#?}", self.held)
                }
            }
        }
        // And whatever else has arrived already, so that a change that
        // touched more than it should is seen with it.
        while let Ok(d) = self.deltas.try_recv() {
            self.held.apply(&d);
            seen.push(d);
        }
        seen
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The resources of namespace `ns` the deltas touched, each once per delta.
fn touched_in(deltas: &[Delta], ns: &str) -> Vec<String> {
    let workload_prefix = format!("{CLUSTER_ID}//Pod/{ns}/");
    let other_prefix = format!("{ns}/");
    deltas.iter().flat_map(names).filter(|n| n.starts_with(&workload_prefix) || n.starts_with(&other_prefix)).collect()
}

// ---------------------------------------------------------------------------
// Tokens

/// A TokenRequest for `ns/sa`: bound to `pod` when given, for `audience`.
async fn token(client: &kube::Client, ns: &str, sa: &str, pod: Option<&Pod>, audience: &str) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.into()],
            // The least the API server issues.
            expiration_seconds: Some(600),
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("a TokenRequest");
    answer.status.expect("a TokenRequest answer has a status").token
}

/// What the API server itself says of `token` for the CA's audience.
async fn reviewed(client: &kube::Client, token: &str) -> bool {
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.into()), audiences: Some(vec![CA_AUDIENCE.into()]) },
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await.expect("a TokenReview");
    answer.status.and_then(|s| s.authenticated) == Some(true)
}

/// `token` (a JWT the API server issued) with its lifetime moved into the
/// past and signed again with the API server's own service-account key:
/// what the API server would have issued an hour and a half ago for ten
/// minutes. TokenRequest cannot issue a token that is already expired.
fn expired_copy(token: &str, server: &KubeTestServer) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    let mut parts = token.split('.');
    let (header, claims) = (parts.next().unwrap(), parts.next().unwrap());
    let mut claims: serde_json::Value = serde_json::from_slice(&B64.decode(claims).unwrap()).unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    claims["iat"] = json!(now - 5400);
    claims["nbf"] = json!(now - 5400);
    claims["exp"] = json!(now - 4800);
    let header_json: serde_json::Value = serde_json::from_slice(&B64.decode(header).unwrap()).unwrap();
    assert_eq!(header_json["alg"], "ES256", "kubetest signs service-account tokens with a P-256 key");
    let signing_input = format!("{header}.{}", B64.encode(serde_json::to_vec(&claims).unwrap()));
    let pem = std::fs::read_to_string(server.service_account_signing_key()).expect("the API server's service-account key");
    let der = rustls_pki_types::PrivateKeyDer::Pkcs8(rcgen::KeyPair::from_pem(&pem).expect("a PKCS#8 key").serialize_der().into());
    let key = rustls::crypto::aws_lc_rs::sign::any_ecdsa_type(&der).expect("an ECDSA key");
    let signer = key.choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256]).expect("a P-256 key");
    let signature = jose_signature(&signer.sign(signing_input.as_bytes()).unwrap());
    format!("{signing_input}.{}", B64.encode(signature))
}

/// An ECDSA P-256 signature as TLS makes it (DER: a SEQUENCE of the
/// INTEGERs r and s) in JWS's form: r then s, 32 bytes each.
fn jose_signature(der: &[u8]) -> Vec<u8> {
    // Short-form lengths only: a P-256 signature's SEQUENCE is at most 72 bytes.
    assert_eq!(der[0], 0x30, "a DER SEQUENCE");
    let mut rest = &der[2..];
    let mut out = Vec::with_capacity(64);
    for _ in 0..2 {
        assert_eq!(rest[0], 0x02, "a DER INTEGER");
        let len = rest[1] as usize;
        let int = &rest[2..2 + len];
        let int = &int[int.iter().take_while(|b| **b == 0).count()..];
        out.resize(out.len() + 32 - int.len(), 0);
        out.extend_from_slice(int);
        rest = &rest[2 + len..];
    }
    out
}

// ---------------------------------------------------------------------------
// Test 1: objects in, resources out, deltas

const SHOP: &str = "shop";

// one story on one real kube-apiserver: each change is checked as exactly one delta after the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_made_through_the_api_reach_a_node_proxy_and_each_change_is_one_delta() {
    logs();
    let server = api_server().await;
    let client = server.client().await.unwrap();
    assert!(
        !istio_crds_installed(&client).await,
        "this test starts the control plane before the Istio CRDs exist, and installs them itself"
    );

    // A meshed namespace, its accounts and pods: web-1 and db-1 on node-a,
    // web-2 on node-b.
    create_namespace(&client, SHOP, json!({"istio.io/dataplane-mode": "ambient"})).await;
    for sa in ["web", "db"] {
        create_service_account(&client, SHOP, sa).await;
    }
    create_pod(&client, SHOP, "web-1", "node-a", "web", json!({"app": "web"}), Some("10.244.1.11")).await;
    create_pod(&client, SHOP, "web-2", "node-b", "web", json!({"app": "web"}), Some("10.244.2.12")).await;
    create_pod(&client, SHOP, "db-1", "node-a", "db", json!({"app": "db"}), Some("10.244.1.13")).await;
    // A service selecting web by a named target port; one without selector
    // whose EndpointSlice points at db-1's address (no controller runs to
    // make slices for the first).
    let services = Api::<Service>::namespaced(client.clone(), SHOP);
    let web_svc: Service = from_json(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http-alt", "protocol": "TCP"}]},
    }));
    let web_svc = services.create(&PostParams::default(), &web_svc).await.expect("creating a service");
    let ext_svc: Service = from_json(json!({
        "metadata": {"name": "ext-db"},
        "spec": {"ports": [{"name": "pg", "port": 5432, "targetPort": 5432, "protocol": "TCP"}]},
    }));
    let ext_svc = services.create(&PostParams::default(), &ext_svc).await.expect("creating a service");
    let slice: EndpointSlice = from_json(json!({
        "metadata": {"name": "ext-db-1", "labels": {"kubernetes.io/service-name": "ext-db"}},
        "addressType": "IPv4",
        "ports": [{"name": "pg", "port": 5433, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.1.13"]}],
    }));
    Api::<EndpointSlice>::namespaced(client.clone(), SHOP).create(&PostParams::default(), &slice).await.expect("creating an EndpointSlice");

    // The control plane starts with no Istio CRDs: it serves the core kinds.
    let tokens = BTreeMap::from([("node-a", "node-a-token-0123456789abcdef")]);
    let control = ControlPlane::start(&server, Some(&tokens)).await;
    // Not the 15 s given to custom kinds whose watch fails: the API server
    // says these are not served, so there is nothing to wait for.
    assert!(control.started_in < Duration::from_secs(10), "absent CRDs were waited for: serving after {:?}", control.started_in);
    let mut proxy = Proxy::connect(control.channel(tokens["node-a"]), "node-a");

    let cluster_ip = |s: &Service| -> IpAddr { s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()).unwrap().parse().unwrap() };
    let web_host = "web.shop.svc.cluster.local";
    let ext_host = "ext-db.shop.svc.cluster.local";
    let web_key = format!("{SHOP}/{web_host}");
    let ext_key = format!("{SHOP}/{ext_host}");
    let expected_workload = |name: &str, ip: &str, node: &str, sa: &str, app: &str| Workload {
        uid: uid(SHOP, name),
        name: name.into(),
        namespace: SHOP.into(),
        addresses: vec![ip.parse().unwrap()],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: sa.into(),
        node: node.into(),
        canonical_name: app.into(),
        canonical_revision: "latest".into(),
        workload_type: WorkloadType::Pod,
        workload_name: name.into(),
        status: WorkloadStatus::Healthy,
        cluster_id: CLUSTER_ID.into(),
        capacity: 1,
        ..Default::default()
    };
    let web_services = BTreeMap::from([(
        web_key.clone(),
        vec![Port { service_port: 80, target_port: 8080, app_protocol: slipstream_core::AppProtocol::Http11 }],
    )]);
    let web1 = Workload { services: web_services.clone(), ..expected_workload("web-1", "10.244.1.11", "node-a", "web", "web") };
    let web2 = Workload { services: web_services.clone(), ..expected_workload("web-2", "10.244.2.12", "node-b", "web", "web") };
    let db1 = Workload {
        services: BTreeMap::from([(
            ext_key.clone(),
            vec![Port { service_port: 5432, target_port: 5433, app_protocol: Default::default() }],
        )]),
        ..expected_workload("db-1", "10.244.1.13", "node-a", "db", "db")
    };
    let web_service = MeshService {
        name: "web".into(),
        namespace: SHOP.into(),
        hostname: web_host.into(),
        addresses: vec![NetworkAddress { network: String::new(), address: cluster_ip(&web_svc) }],
        // Named target ports are resolved per workload.
        ports: vec![Port { service_port: 80, target_port: 0, app_protocol: slipstream_core::AppProtocol::Http11 }],
        subject_alt_names: vec![],
        waypoint: None,
    };
    let ext_service = MeshService {
        name: "ext-db".into(),
        namespace: SHOP.into(),
        hostname: ext_host.into(),
        addresses: vec![NetworkAddress { network: String::new(), address: cluster_ip(&ext_svc) }],
        ports: vec![Port { service_port: 5432, target_port: 5432, app_protocol: Default::default() }],
        subject_alt_names: vec![],
        waypoint: None,
    };
    proxy
        .until("the shop's workloads and services", |h| {
            h.workload(SHOP, "web-1").is_some()
                && h.workload(SHOP, "web-2").is_some()
                && h.workload(SHOP, "db-1").is_some()
                && h.services.contains_key(&web_key)
                && h.services.contains_key(&ext_key)
        })
        .await;
    assert_eq!(proxy.held.workload(SHOP, "web-1"), Some(&web1));
    assert_eq!(proxy.held.workload(SHOP, "web-2"), Some(&web2));
    assert_eq!(proxy.held.workload(SHOP, "db-1"), Some(&db1));
    assert_eq!(proxy.held.services.get(&web_key), Some(&web_service));
    assert_eq!(proxy.held.services.get(&ext_key), Some(&ext_service));

    // The CRDs arrive later, then a policy selecting web: the control
    // plane picks the kind up and lists it in the selected workloads.
    install_istio_crds(&client).await;
    create_istio_object(
        &client,
        "AuthorizationPolicy",
        "authorizationpolicies",
        SHOP,
        "web-from-db",
        json!({
            "selector": {"matchLabels": {"app": "web"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/db"]}}], "to": [{"operation": {"ports": ["8080"]}}]}],
        }),
    )
    .await;
    let policy_key = format!("{SHOP}/web-from-db");
    let deltas = proxy
        .until("the policy, listed in web-1's and web-2's authorization_policies", |h| {
            h.policies.contains_key(&policy_key)
                && [h.workload(SHOP, "web-1"), h.workload(SHOP, "web-2")]
                    .iter()
                    .all(|w| w.is_some_and(|w| w.authorization_policies == [policy_key.clone()]))
        })
        .await;
    let policy = &proxy.held.policies[&policy_key];
    assert_eq!((policy.scope, policy.action), (Scope::WorkloadSelector, Action::Allow), "{policy:#?}");
    // Its rule, then (when another test of this shared API server has made
    // a waypoint) the rule that lets waypoints through.
    assert_eq!(
        policy.rules[0].clauses[0].matches[0].principals,
        [slipstream_core::policy::StringMatch::Exact("cluster.local/ns/shop/sa/db".into())]
    );
    assert!(
        policy.rules[1..].iter().all(|r| r.clauses[0].matches[0]
            .principals
            .iter()
            .all(|p| matches!(p, slipstream_core::policy::StringMatch::Exact(w) if w.contains("/sa/")))),
        "{policy:#?}"
    );
    let mut touched = touched_in(&deltas, SHOP);
    touched.sort();
    let mut expected = [policy_key.clone(), uid(SHOP, "web-1"), uid(SHOP, "web-2")];
    expected.sort();
    assert_eq!(touched, expected, "the policy and the two workloads it selects");
    assert_eq!(proxy.held.workload(SHOP, "db-1"), Some(&db1), "db-1 is not selected");

    // web-2 stops being ready: one workload changes.
    set_status(&client, SHOP, "web-2", "10.244.2.12", false).await;
    let deltas = proxy.until("web-2 unhealthy", |h| h.workload(SHOP, "web-2").is_some_and(|w| w.status == WorkloadStatus::Unhealthy)).await;
    assert_eq!(touched_in(&deltas, SHOP), [uid(SHOP, "web-2")], "one delta with web-2 alone: {deltas:#?}");

    // web-1's label changes: the service and the policy no longer select
    // it; still one resource, web-1.
    let relabel = json!({"metadata": {"labels": {"app": "web-old"}}});
    Api::<Pod>::namespaced(client.clone(), SHOP).patch("web-1", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    let deltas = proxy
        .until("web-1 out of the service and the policy", |h| {
            h.workload(SHOP, "web-1").is_some_and(|w| w.services.is_empty() && w.authorization_policies.is_empty())
        })
        .await;
    assert_eq!(touched_in(&deltas, SHOP), [uid(SHOP, "web-1")], "{deltas:#?}");
    assert_eq!(proxy.held.workload(SHOP, "web-1").unwrap().canonical_name, "web-old");

    // db-1 is deleted: with no kubelet to confirm, a graceful deletion only
    // marks it (unhealthy from then on); forced, it is gone: a removal.
    let pods = Api::<Pod>::namespaced(client.clone(), SHOP);
    pods.delete("db-1", &DeleteParams::default()).await.unwrap();
    let deltas = proxy
        .until("db-1 unhealthy while terminating", |h| h.workload(SHOP, "db-1").is_some_and(|w| w.status == WorkloadStatus::Unhealthy))
        .await;
    assert_eq!(touched_in(&deltas, SHOP), [uid(SHOP, "db-1")], "{deltas:#?}");
    pods.delete("db-1", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    let deltas = proxy.until("db-1 removed", |h| h.workload(SHOP, "db-1").is_none()).await;
    assert_eq!(touched_in(&deltas, SHOP), [uid(SHOP, "db-1")], "{deltas:#?}");
    let removal = deltas.iter().find(|d| d.removals.contains(&uid(SHOP, "db-1"))).expect("a removal, not an upsert");
    assert_eq!(removal.type_url, TypeUrl::Address);
    assert!(proxy.held.services.contains_key(&ext_key), "the service stays");

    // A mesh-wide kind of the second CRD reaches the pods too: STRICT in
    // the namespace becomes a converted DENY policy per meshed workload.
    create_istio_object(&client, "PeerAuthentication", "peerauthentications", SHOP, "strict", json!({"mtls": {"mode": "STRICT"}})).await;
    proxy
        .until("converted STRICT policies for web-1 and web-2", |h| {
            ["web-1", "web-2"]
                .iter()
                .all(|p| h.policies.keys().any(|k| k.starts_with(SHOP) && k.contains("istio_converted_strict") && k.ends_with(p)))
        })
        .await;

    // The AuthorizationPolicy CRD is deleted: the API server deletes its
    // objects first (watched as deletions), then stops serving the kind.
    // The policy goes, and web-2 no longer lists it.
    Api::<CustomResourceDefinition>::all(client.clone())
        .delete("authorizationpolicies.security.istio.io", &DeleteParams::default())
        .await
        .unwrap();
    let deltas = proxy
        .until("the policy removed with its CRD", |h| {
            !h.policies.contains_key(&policy_key)
                && h.workload(SHOP, "web-2").is_some_and(|w| !w.authorization_policies.contains(&policy_key))
        })
        .await;
    let mut touched = touched_in(&deltas, SHOP);
    touched.sort();
    let mut expected = [policy_key.clone(), uid(SHOP, "web-2")];
    expected.sort();
    assert_eq!(touched, expected, "{deltas:#?}");

    drop(proxy);
    control.stop().await;
}

// ---------------------------------------------------------------------------
// Test 2: certificates and streams for ServiceAccount tokens (TokenReview)

const BANK: &str = "bank";
const TELLER: &str = "spiffe://cluster.local/ns/bank/sa/teller";
const VAULT: &str = "spiffe://cluster.local/ns/bank/sa/vault";

struct Ask {
    token: String,
    csr: String,
    impersonate: Option<String>,
}

impl Ask {
    fn new(token: &str, identity: &str) -> (Ask, slipstream_identity::WorkloadKey) {
        let (csr, key) = generate_csr(&identity.parse::<SpiffeId>().unwrap()).unwrap();
        (Ask { token: token.into(), csr, impersonate: Some(identity.into()) }, key)
    }

    async fn send(self, control: &ControlPlane) -> Result<Vec<String>, tonic::Status> {
        let channel = control.channel(&self.token);
        let metadata = self.impersonate.as_deref().map(|i| string_struct([(IMPERSONATED_IDENTITY, i)]));
        let req = channel.request(IstioCertificateRequest { csr: self.csr, validity_duration: 3600, metadata }).unwrap();
        IstioCertificateServiceClient::new(channel.channel()).create_certificate(req).await.map(|r| r.into_inner().cert_chain)
    }
}

/// Opens an ADS stream as `node` with `token`: the stream's first answer,
/// or how it was refused.
async fn open_stream(control: &ControlPlane, token: &str, node: &str) -> Result<(), tonic::Status> {
    let channel = control.channel(token);
    let info = NodeInfo {
        node_name: node.into(),
        cluster_id: CLUSTER_ID.into(),
        ip: "192.0.2.1".into(),
        pod: format!("ztunnel-{node}"),
        namespace: ZTUNNEL_NS.into(),
    };
    let first = DeltaDiscoveryRequest { node: Some(info.node()), type_url: TypeUrl::Address.as_str().into(), ..Default::default() };
    let (tx, rx) = mpsc::channel(1);
    tx.send(first).await.unwrap();
    let req = channel.request(tokio_stream::wrappers::ReceiverStream::new(rx)).unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(channel.channel()).delta_aggregated_resources(req).await?.into_inner();
    let answer = tokio::time::timeout(WAIT, stream.message()).await.expect("an answer in time")?;
    drop(tx);
    answer.map(|_| ()).ok_or_else(|| tonic::Status::unknown("the stream ended without an answer"))
}

// one story on one real kube-apiserver: tokens of several nodes asked in turn, each answer depending on the pods made before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_proxies_authenticate_with_service_account_tokens_and_get_only_their_nodes_identities() {
    logs();
    let server = api_server().await;
    let client = server.client().await.unwrap();

    // The node proxies' namespace and account (and an account that is not
    // theirs); a pod of each on n1, as the DaemonSet would run them.
    create_namespace(&client, ZTUNNEL_NS, json!({})).await;
    for sa in [ZTUNNEL_SA, "not-ztunnel"] {
        create_service_account(&client, ZTUNNEL_NS, sa).await;
    }
    let ztunnel_n1 = create_pod(&client, ZTUNNEL_NS, "ztunnel-n1", "n1", ZTUNNEL_SA, json!({"app": "ztunnel"}), None).await;
    let impostor_n1 = create_pod(&client, ZTUNNEL_NS, "impostor-n1", "n1", "not-ztunnel", json!({"app": "impostor"}), None).await;
    let doomed = create_pod(&client, ZTUNNEL_NS, "ztunnel-doomed", "n1", ZTUNNEL_SA, json!({"app": "ztunnel"}), None).await;
    // The mesh's pods: teller on n1, vault on n2.
    create_namespace(&client, BANK, json!({"istio.io/dataplane-mode": "ambient"})).await;
    for sa in ["teller", "vault"] {
        create_service_account(&client, BANK, sa).await;
    }
    create_pod(&client, BANK, "teller-1", "n1", "teller", json!({"app": "teller"}), Some("10.244.7.21")).await;
    create_pod(&client, BANK, "vault-1", "n2", "vault", json!({"app": "vault"}), Some("10.244.8.22")).await;

    // No --node-tokens: callers are checked with TokenReview (account
    // istio-system/ztunnel, audience istio-ca, the defaults).
    let control = ControlPlane::start(&server, None).await;
    let n1 = token(&client, ZTUNNEL_NS, ZTUNNEL_SA, Some(&ztunnel_n1), CA_AUDIENCE).await;

    // A CSR for teller, which runs on n1: signed, leaf then the root bundle.
    let (ask, key) = Ask::new(&n1, TELLER);
    let chain = ask.send(&control).await.expect("n1's proxy gets teller's certificate");
    assert_eq!(chain.len(), 2, "leaf, then the root bundle: {chain:#?}");
    assert_eq!(chain[1], control.roots_pem(), "the root bundle last");
    let cert = WorkloadCert::from_istio_chain(&chain, key).expect("the leaf chains to the root");
    assert_eq!(cert.identity().to_string(), TELLER);

    // Refusals, each with its code and what it says.
    let two_identities = {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = vec![rcgen::SanType::URI(TELLER.try_into().unwrap()), rcgen::SanType::URI(VAULT.try_into().unwrap())];
        p.serialize_request(&key).unwrap().pem().unwrap()
    };
    let impostor = token(&client, ZTUNNEL_NS, "not-ztunnel", Some(&impostor_n1), CA_AUDIENCE).await;
    let wrong_audience = token(&client, ZTUNNEL_NS, ZTUNNEL_SA, Some(&ztunnel_n1), API_AUDIENCE).await;
    let unbound = token(&client, ZTUNNEL_NS, ZTUNNEL_SA, None, CA_AUDIENCE).await;
    let expired = expired_copy(&n1, &server);
    // A token whose pod is then deleted: the API server stops honouring
    // it once its informer hears of the deletion (moments later), and,
    // had it been reviewed before, after its 10 s cache of successes. Not
    // reviewed before here; polled until the API server itself refuses it.
    let orphan = token(&client, ZTUNNEL_NS, ZTUNNEL_SA, Some(&doomed), CA_AUDIENCE).await;
    Api::<Pod>::namespaced(client.clone(), ZTUNNEL_NS)
        .delete("ztunnel-doomed", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while reviewed(&client, &orphan).await {
        assert!(Instant::now() < deadline, "the token of a deleted pod still passes TokenReview after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let cases: Vec<(&str, Ask, Code, &str, &str)> = vec![
        (
            "another node's pod",
            Ask::new(&n1, VAULT).0,
            Code::PermissionDenied,
            "no pod on n1 runs as spiffe://cluster.local/ns/bank/sa/vault",
            "",
        ),
        (
            "a bogus token",
            Ask { token: "not-a-token".into(), ..Ask::new(&n1, TELLER).0 },
            Code::Unauthenticated,
            "the token was refused: TokenReview: ",
            "",
        ),
        (
            "a token of an account that is not a node proxy's",
            Ask::new(&impostor, TELLER).0,
            Code::Unauthenticated,
            "the token was refused: service account istio-system/not-ztunnel is neither a node proxy's (allowed: istio-system/ztunnel) \
             nor the token of a waypoint's pod (a pod of Gateway istio-system/not-ztunnel of class istio-waypoint)",
            "",
        ),
        (
            "a token for another audience",
            Ask::new(&wrong_audience, TELLER).0,
            Code::Unauthenticated,
            "the token was refused: TokenReview: ",
            "audience",
        ),
        (
            "a token bound to no pod",
            Ask::new(&unbound, TELLER).0,
            Code::Unauthenticated,
            "the token was refused: the token of istio-system/ztunnel is not bound to a pod",
            "",
        ),
        ("an expired token", Ask::new(&expired, TELLER).0, Code::Unauthenticated, "the token was refused: TokenReview: ", "expired"),
        (
            "the token of a deleted pod",
            Ask::new(&orphan, TELLER).0,
            Code::Unauthenticated,
            "the token was refused: TokenReview: ",
            "invalidated",
        ),
        (
            "a malformed CSR",
            Ask { csr: "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n".into(), ..Ask::new(&n1, TELLER).0 },
            Code::InvalidArgument,
            "invalid CSR: malformed PKCS#10 DER",
            "",
        ),
        (
            "a CSR for two identities",
            Ask { csr: two_identities, impersonate: None, ..Ask::new(&n1, TELLER).0 },
            Code::InvalidArgument,
            "invalid CSR: the CSR asks for 2 identities",
            "exactly one is allowed",
        ),
    ];
    for (what, ask, code, starts, contains) in cases {
        let token = ask.token.clone();
        let status = ask.send(&control).await.expect_err(what);
        eprintln!("{what}: {:?}: {}", status.code(), status.message());
        assert_eq!(status.code(), code, "{what}: {}", status.message());
        assert!(status.message().starts_with(starts), "{what}: got {:?}, want it to start with {starts:?}", status.message());
        assert!(status.message().contains(contains), "{what}: got {:?}, want it to say {contains:?}", status.message());
        assert!(!status.message().contains(&token), "{what}: the token is in the answer");
    }

    // The xDS stream: n1's token opens a stream for n1 only.
    let mut proxy = Proxy::connect(control.channel(&n1), "n1");
    proxy
        .until("teller-1 and vault-1 at n1's proxy", |h| h.workload(BANK, "teller-1").is_some() && h.workload(BANK, "vault-1").is_some())
        .await;
    let refused = open_stream(&control, &n1, "n2").await.expect_err("n1's token acting for n2");
    assert_eq!(refused.code(), Code::PermissionDenied, "{}", refused.message());
    assert!(
        refused.message().contains("n1") && refused.message().contains("NODE_NAME=n2"),
        "the refusal names both nodes: {}",
        refused.message()
    );
    let refused = open_stream(&control, "not-a-token", "n1").await.expect_err("a bogus token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{}", refused.message());
    let refused = open_stream(&control, &impostor, "n1").await.expect_err("a token of another account");
    assert_eq!(refused.code(), Code::Unauthenticated, "{}", refused.message());
    open_stream(&control, &n1, "n1").await.expect("n1's token for n1");

    drop(proxy);
    control.stop().await;
}

// ---------------------------------------------------------------------------
// The gateway controller

/// The Gateway API release whose CRDs the test installs.
const GATEWAY_API: &str = "sigs.k8s.io/gateway-api@v1.4.1";

/// The Gateway API's own Gateway CRD (its schema, defaults and CEL rules,
/// so the status the controller writes is checked as a real cluster
/// checks it), read from the Go module of the release: `go mod download`
/// fetches it once into the module cache. Installed once for the tests
/// sharing the server; returns once the API server serves it. Fails,
/// never skips, when Go or the module cannot be had.
async fn install_gateway_crd(client: &kube::Client) {
    use serde::Deserialize;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let name = "gateways.gateway.networking.k8s.io";
    if crds.get_opt(name).await.expect("reading CRDs").is_none() {
        let go = ["go", "/usr/local/go/bin/go"]
            .into_iter()
            .find(|g| std::process::Command::new(g).arg("version").output().is_ok_and(|o| o.status.success()))
            .expect("Go is needed to fetch the Gateway API's CRDs (scripts/setup.sh and scripts/kube-apiserver.sh use it too)");
        let out = std::process::Command::new(go)
            .args(["mod", "download", "-json", GATEWAY_API])
            .current_dir(std::env::temp_dir())
            .output()
            .expect("running go mod download");
        assert!(out.status.success(), "go mod download {GATEWAY_API}: {}", String::from_utf8_lossy(&out.stderr));
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("go mod download -json");
        let dir = PathBuf::from(info["Dir"].as_str().expect("the module's directory"));
        let file = dir.join("config/crd/standard/gateway.networking.k8s.io_gateways.yaml");
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let crd = CustomResourceDefinition::deserialize(serde_yaml::Deserializer::from_str(&text)).expect("the Gateway CRD");
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            // Another test of this server got there first.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating the Gateway CRD: {e}"),
        }
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let got = crds.get(name).await.expect("reading a CRD");
        let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
            break;
        }
        assert!(Instant::now() < deadline, "CRD {name} not established after {WAIT:?}: {conditions:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates what deploy/kubernetes/control-plane-rbac.yaml holds, its
/// account (and the root namespace its Role is for) in namespace `ns` (not
/// istio-system, which another test of this shared server makes): start
/// the control plane with `--root-namespace ns`. Returns a kubeconfig that
/// authenticates as that account.
async fn as_control_plane_account(server: &KubeTestServer, client: &kube::Client, ns: &str) -> PathBuf {
    use serde::Deserialize;
    let text =
        include_str!("../../../deploy/kubernetes/control-plane-rbac.yaml").replace("namespace: istio-system", &format!("namespace: {ns}"));
    create_namespace(client, ns, json!({})).await;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let o: DynamicObject = DynamicObject::deserialize(doc).expect("a manifest of deploy/kubernetes");
        let types = o.types.clone().expect("apiVersion and kind");
        let (group, version) = types.api_version.rsplit_once('/').unwrap_or(("", &types.api_version));
        let plural = match types.kind.as_str() {
            "ServiceAccount" => "serviceaccounts",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            "Role" => "roles",
            "RoleBinding" => "rolebindings",
            other => panic!("deploy/kubernetes: unexpected kind {other}"),
        };
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, &types.kind), plural);
        let api = match o.metadata.namespace.as_deref() {
            Some(n) => Api::<DynamicObject>::namespaced_with(client.clone(), n, &ar),
            None => Api::<DynamicObject>::all_with(client.clone(), &ar),
        };
        api.create(&PostParams::default(), &o).await.unwrap_or_else(|e| panic!("creating {} from deploy/kubernetes: {e}", types.kind));
    }
    let token = token(client, ns, "slipstream-control", None, API_AUDIENCE).await;
    let dir = server.dir().join(format!("as-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, server.ca_pem()).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": {"server": server.server_url(), "certificate-authority": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
    });
    std::fs::write(&kubeconfig, serde_json::to_string(&config).unwrap()).unwrap();
    kubeconfig
}

fn gateway_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"), "gateways")
}

/// Polls `get` until `done` says yes (returning what it saw), or fails
/// naming `what` and the last thing seen.
async fn eventually<T: std::fmt::Debug, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    get: impl Fn() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen = get().await;
        if let Some(v) = seen {
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: not after {WAIT:?}; last seen {v:#?}");
        } else {
            assert!(Instant::now() < deadline, "{what}: not after {WAIT:?}; nothing there");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

fn condition_is(status: &serde_json::Value, type_: &str, value: &str, reason: &str) -> bool {
    condition(status, type_).is_some_and(|c| c["status"] == value && c["reason"] == reason)
}

// one story on one real kube-apiserver: each step builds on the one before (the Gateway, its Deployment, its status, its identity).
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waypoint_gateway_is_deployed_its_status_written_and_its_account_gets_its_own_identity_only() {
    use k8s_openapi::api::apps::v1::Deployment;
    logs();
    let server = api_server().await;
    let client = server.client().await.unwrap();
    install_gateway_crd(&client).await;
    const NS: &str = "wp-shop";
    create_namespace(&client, NS, json!({})).await;

    // The control plane runs as the account deploy/kubernetes gives it,
    // with exactly that ClusterRole (this API server authorizes with
    // RBAC): what it does below is what the shipped permissions allow.
    let kubeconfig = as_control_plane_account(&server, &client, "wp-control").await;
    let kubeconfig = kubeconfig.display().to_string();
    let control = ControlPlane::start_with(
        &server,
        None,
        &[
            "--gateway-resync",
            "5s",
            "--waypoint-image",
            "registry.example/slipstream:t",
            "--kubeconfig",
            &kubeconfig,
            "--root-namespace",
            "wp-control",
        ],
    )
    .await;

    // The Gateway, as a user applies it.
    let ar = gateway_resource();
    let gateways = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar);
    // A waypoint Gateway named `name` whose listener is on `port`, and
    // (for those made later) its status as it changes.
    let create_gateway = |name: &'static str, port: u16| {
        let gateways = gateways.clone();
        let gw = DynamicObject::new(name, &ar).within(NS).data(json!({"spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": port, "protocol": "HBONE"}],
        }}));
        async move { gateways.create(&PostParams::default(), &gw).await.expect("creating a Gateway") }
    };
    let status_of = |name: &'static str| {
        let gateways = gateways.clone();
        move || {
            let gateways = gateways.clone();
            async move { gateways.get_opt(name).await.unwrap().map(|g| g.data["status"].clone()) }
        }
    };
    let gw = create_gateway("waypoint", 15008).await;
    let gw_uid = gw.metadata.uid.clone().unwrap();

    // What it makes: a ServiceAccount, a Deployment and a Service named
    // after it, owned by it (Kubernetes' garbage collector, which this
    // test does not run, deletes them with it).
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let d = eventually("the waypoint's Deployment", || async { deployments.get_opt("waypoint").await.unwrap() }, |_| true).await;
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str(), owner.controller),
        ("Gateway", "waypoint", gw_uid.as_str(), Some(true))
    );
    let pod_spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod_spec.service_account_name.as_deref(), Some("waypoint"));
    assert_eq!(pod_spec.containers[0].image.as_deref(), Some("registry.example/slipstream:t"));
    let env: BTreeMap<String, Option<String>> =
        pod_spec.containers[0].env.clone().unwrap().into_iter().map(|e| (e.name, e.value)).collect();
    assert_eq!(
        env["SLIPSTREAM_WAYPOINT_ROOT_PEM"].as_deref(),
        Some(control.roots_pem().as_str()),
        "the mesh root, to verify the control plane"
    );
    assert_eq!(env["SLIPSTREAM_WAYPOINT_TOKEN_FILE"].as_deref(), Some("/var/run/secrets/tokens/istio-token"));
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), NS).get("waypoint").await.expect("the waypoint's ServiceAccount");
    assert_eq!(sa.metadata.owner_references.unwrap()[0].uid, gw_uid);
    let svc = Api::<Service>::namespaced(client.clone(), NS).get("waypoint").await.expect("the waypoint's Service");
    assert_eq!(svc.metadata.owner_references.unwrap()[0].uid, gw_uid);
    let cluster_ip = svc.spec.unwrap().cluster_ip.expect("the API server gives the Service a ClusterIP");
    let managed = |fields: &Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>>| {
        fields.iter().flatten().any(|f| f.manager.as_deref() == Some("slipstream") && f.operation.as_deref() == Some("Apply"))
    };
    assert!(managed(&d.metadata.managed_fields), "applied server-side by field manager slipstream");

    // Its status: accepted, not programmed until a pod of it is ready; its address.
    let gw_status = || async { gateways.get_opt("waypoint").await.unwrap().map(|g| g.data["status"].clone()) };
    let st = eventually("the Gateway accepted and pending", gw_status, |s| {
        condition_is(s, "Accepted", "True", "Accepted") && condition_is(s, "Programmed", "False", "Pending") && s["addresses"].is_array()
    })
    .await;
    assert_eq!(st["addresses"], json!([{"type": "IPAddress", "value": cluster_ip}]));
    assert!(condition(&st, "Programmed").unwrap()["lastTransitionTime"].is_string(), "{st:#}");

    // A service asking for it: refused while no waypoint pod is ready.
    let services = Api::<Service>::namespaced(client.clone(), NS);
    let reviews: Service = from_json(json!({"metadata": {"name": "reviews", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {"selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}));
    services.create(&PostParams::default(), &reviews).await.unwrap();
    let svc_status =
        || async { services.get_opt("reviews").await.unwrap().map(|s| serde_json::to_value(s.status.unwrap_or_default()).unwrap()) };
    eventually("reviews refused, its waypoint not ready", svc_status, |s| {
        condition_is(s, "istio.io/WaypointBound", "False", "WaypointIsNotReady")
    })
    .await;

    // A waypoint pod becomes ready (this API server has no controllers and
    // no kubelet: the test does what the deployment controller, the
    // ReplicaSet controller and the kubelet would): programmed, and
    // reviews is bound.
    create_service_account(&client, NS, "reviews").await;
    let rs = replica_set_of(&client, &d).await;
    let wp_pod = pod_of(&client, &rs, "waypoint-7d9f-a", "10.244.9.5", |_| {}).await;
    let st = eventually("the Gateway programmed", gw_status, |s| condition_is(s, "Programmed", "True", "Programmed")).await;
    assert!(
        condition(&st, "Programmed").unwrap()["message"].as_str().unwrap().contains("waypoint.wp-shop.svc.cluster.local:15008"),
        "{st:#}"
    );
    let bound = eventually("reviews bound", svc_status, |s| condition_is(s, "istio.io/WaypointBound", "True", "WaypointAccepted")).await;
    assert_eq!(condition(&bound, "istio.io/WaypointBound").unwrap()["message"], "bound to wp-shop/waypoint");

    // The waypoint's own pod-bound token: its own identity, and nothing else.
    let own = format!("spiffe://cluster.local/ns/{NS}/sa/waypoint");
    let wp_token = token(&client, NS, "waypoint", Some(&wp_pod), CA_AUDIENCE).await;
    let (ask, key) = Ask::new(&wp_token, &own);
    let chain = ask.send(&control).await.expect("the waypoint gets its own certificate");
    assert_eq!(WorkloadCert::from_istio_chain(&chain, key).unwrap().identity().to_string(), own);
    open_stream(&control, &wp_token, "wp-node").await.expect("the waypoint's configuration stream, on its pod's node");
    let e = open_stream(&control, &wp_token, "n1").await.expect_err("a stream claiming another node");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let (ask, _) = Ask::new(&wp_token, &format!("spiffe://cluster.local/ns/{NS}/sa/reviews"));
    let e = ask.send(&control).await.expect_err("another identity");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("may obtain only its own identity"), "{}", e.message());
    // Any other workload's token is refused, naming what it would need.
    let reviews_pod = create_pod(&client, NS, "reviews-1", "wp-node", "reviews", json!({"app": "reviews"}), Some("10.244.9.6")).await;
    let reviews_token = token(&client, NS, "reviews", Some(&reviews_pod), CA_AUDIENCE).await;
    let (ask, _) = Ask::new(&reviews_token, &format!("spiffe://cluster.local/ns/{NS}/sa/reviews"));
    let e = ask.send(&control).await.expect_err("a workload that is not a waypoint");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("nor the token of a waypoint's pod"), "{}", e.message());
    assert_eq!(open_stream(&control, &reviews_token, "wp-node").await.unwrap_err().code(), Code::Unauthenticated);
    // Another pod of the waypoint's account that is not a pod of the
    // Gateway (no gateway-name label) gets nothing either.
    let lookalike = create_pod(&client, NS, "lookalike-1", "wp-node", "waypoint", json!({"app": "lookalike"}), Some("10.244.9.7")).await;
    let lookalike_token = token(&client, NS, "waypoint", Some(&lookalike), CA_AUDIENCE).await;
    let (ask, _) = Ask::new(&lookalike_token, &own);
    let e = ask.send(&control).await.expect_err("a pod that merely runs as the waypoint's account");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // A tenant who may create pods in the waypoint's namespace forges the
    // whole chain: the real ReplicaSet's uid in ownerReferences, the
    // waypoint's account and labels, its image; and runs its own command
    // (any other field would do: genuine.rs has the table). No
    // certificate, no configuration, never a replica of the waypoint.
    let forged = pod_of(&client, &rs, "waypoint-7d9f-x", "10.244.9.8", |spec| {
        spec["containers"][0]["command"] = json!(["sh", "-c", "cat /var/run/secrets/tokens/istio-token"]);
    })
    .await;
    assert_eq!(forged.metadata.owner_references, wp_pod.metadata.owner_references, "the same owner");
    assert_eq!(forged.metadata.labels, wp_pod.metadata.labels, "the same labels");
    let forged_token = token(&client, NS, "waypoint", Some(&forged), CA_AUDIENCE).await;
    assert!(reviewed(&client, &forged_token).await, "a valid token of the waypoint's account, bound to the forged pod");
    let (ask, _) = Ask::new(&forged_token, &own);
    let e = ask.send(&control).await.expect_err("a pod that copies the waypoint's chain but runs something else");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(open_stream(&control, &forged_token, "wp-node").await.unwrap_err().code(), Code::Unauthenticated);
    // What the mesh is told: the genuine pod is the waypoint's replica,
    // the forged one is a workload of nothing.
    let mut view = Proxy::connect_for(control.channel(&wp_token), "wp-node", &TypeUrl::WAYPOINT);
    let waypoint_service = format!("{NS}/waypoint.{NS}.svc.cluster.local");
    view.until("both pods, the waypoint's replica and the forgery", |h| {
        h.workload(NS, "waypoint-7d9f-a").is_some_and(|w| w.services.contains_key(&waypoint_service))
            && h.workload(NS, "waypoint-7d9f-x").is_some()
    })
    .await;
    assert!(
        !view.held.workload(NS, "waypoint-7d9f-x").unwrap().services.contains_key(&waypoint_service),
        "the forged pod is never a replica of the waypoint's Service"
    );

    // MeshConfig where Istio's operators put it (the root namespace's
    // `istio` ConfigMap, read with the Role the RBAC file gives): sent to
    // the waypoint.
    let mesh: k8s_openapi::api::core::v1::ConfigMap = from_json(json!({"metadata": {"name": "istio"}, "data": {"mesh":
        "pathNormalization:\n  normalization: DECODE_AND_MERGE_SLASHES\ndefaultConfig:\n  gatewayTopology: {numTrustedProxies: 1}\n"}}));
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "wp-control")
        .create(&PostParams::default(), &mesh)
        .await
        .unwrap();
    view.until("the mesh settings at the waypoint", |h| h.mesh.is_some()).await;
    assert_eq!(
        view.held.mesh,
        Some(slipstream_core::mesh::MeshSettings {
            path_normalization: slipstream_core::mesh::PathNormalization::DecodeAndMergeSlashes,
            num_trusted_proxies: 1
        })
    );

    // A made object deleted by hand comes back within a resync.
    deployments.delete("waypoint", &DeleteParams::default()).await.unwrap();
    let back = eventually(
        "the Deployment restored",
        || async { deployments.get_opt("waypoint").await.unwrap() },
        |b| b.metadata.uid != d.metadata.uid,
    )
    .await;
    assert_ne!(back.metadata.uid, d.metadata.uid, "a new Deployment");

    // reviews stops asking: its condition goes.
    services
        .patch("reviews", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"istio.io/use-waypoint": null}}})))
        .await
        .unwrap();
    eventually("reviews' condition removed", svc_status, |s| condition(s, "istio.io/WaypointBound").is_none()).await;

    // An invalid waypoint Gateway (Kubernetes admits it: the Gateway API
    // knows nothing of waypoints) is not accepted, naming the field, and
    // makes nothing.
    create_gateway("bad", 8080).await;
    let st = eventually("the invalid Gateway refused", status_of("bad"), |s| condition_is(s, "Accepted", "False", "Invalid")).await;
    assert!(condition(&st, "Accepted").unwrap()["message"].as_str().unwrap().contains("spec.listeners[0].port"), "{st:#}");
    assert!(deployments.get_opt("bad").await.unwrap().is_none(), "nothing deployed for an invalid Gateway");

    // A Gateway named like an existing ServiceAccount of the user's: that
    // account is not taken over (deleting the Gateway would delete it),
    // nothing is deployed, and the status says why.
    create_service_account(&client, NS, "taken").await;
    create_gateway("taken", 15008).await;
    let st =
        eventually("the Gateway whose names are taken", status_of("taken"), |s| condition_is(s, "Programmed", "False", "Invalid")).await;
    assert!(
        condition(&st, "Programmed").unwrap()["message"].as_str().unwrap().contains("ServiceAccount wp-shop/taken already exists"),
        "{st:#}"
    );
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), NS).get("taken").await.unwrap();
    assert!(sa.metadata.owner_references.is_none() && sa.metadata.labels.is_none(), "the user's account is untouched: {:?}", sa.metadata);
    assert!(deployments.get_opt("taken").await.unwrap().is_none());
    control.stop().await;
}
