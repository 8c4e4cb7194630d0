//! The proxies' delta xDS client (docs/protocols.md section 4): one ADS
//! stream over the [`ControlChannel`], the type URLs the proxy subscribes
//! to (a node proxy's, [`TypeUrl::NODE`], or a waypoint's,
//! [`TypeUrl::WAYPOINT`]), the mesh configuration as deltas instead of
//! files.
//!
//! The client converts each response (`slipstream_api::convert`) into a
//! [`Delta`] and hands it to the proxy's main loop ([`Update`]), which
//! applies it to its `MeshIndex` (the node proxy's
//! `NodeProxy::apply_delta`, the waypoint's `run::follow`) and says which
//! resources the index refused. A resource that does not convert or is
//! refused stays at its previous version, and the response is NACKed with
//! every refusal (resource name, field, reason); otherwise it is ACKed.
//! The versions the proxy holds are what it sends as
//! `initial_resource_versions` when it reconnects, so a new stream (to the
//! same replica or another) carries only the difference.
//!
//! Static stability: when the stream breaks, the proxy keeps serving with
//! what it has and reconnects with jittered exponential backoff; the
//! connection state is logged when it changes, not at every attempt.

use crate::control::ControlChannel;
use slipstream_api::convert::{address_from_any, authorization_from_any, AddressResource};
use slipstream_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use slipstream_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status};
use slipstream_api::netpol::net_policy_from_any;
use slipstream_api::{string_struct, TypeUrl, NODE_NAME};
use slipstream_core::policy::network::NetPolicy;
use slipstream_core::policy::Authorization;
use slipstream_core::{Service, Workload};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// Largest response accepted: the first push of a big mesh.
const MAX_RESPONSE_BYTES: usize = 128 << 20;

/// Reconnection delays: from `initial`, doubling to `max`, each drawn
/// between half and all of it (jitter, so proxies that lost the same
/// control plane do not come back in step). Back to `initial` after a
/// stream that delivered a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(15) }
    }
}

impl Backoff {
    fn next(&self, current: Duration) -> Duration {
        (current * 2).min(self.max)
    }

    fn jittered(current: Duration) -> Duration {
        current.mul_f64(rand::random::<f64>() * 0.5 + 0.5)
    }
}

/// A resource as the mesh model takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upsert {
    Workload(Workload),
    Service(Service),
    Policy(Authorization),
    NetPolicy(NetPolicy),
    /// A waypoint's routes for one service (waypoints only subscribe).
    Routes(slipstream_core::route::ServiceRoutes),
    /// The mesh-wide settings (waypoints only subscribe).
    Mesh(slipstream_core::mesh::MeshSettings),
}

/// One response, converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub type_url: TypeUrl,
    pub upserts: Vec<Upsert>,
    /// Names to remove (an `Address` name is a workload uid or a service's
    /// `namespace/hostname`).
    pub removals: Vec<String>,
    /// With this delta, every type's first response has arrived: the
    /// proxy holds the whole configuration (set once per process).
    pub complete: bool,
}

/// A resource left at its previous version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The resource's name in the workload API.
    pub name: String,
    /// Field and reason.
    pub reason: String,
}

/// A delta for the proxy to apply, and where to say what it refused.
#[derive(Debug)]
pub struct Update {
    pub delta: Delta,
    reply: oneshot::Sender<Vec<Refusal>>,
}

impl Update {
    /// Applied; `refused` are the resources the index did not take.
    pub fn done(self, refused: Vec<Refusal>) {
        let _ = self.reply.send(refused);
    }
}

/// Who the proxy says it is in its xDS node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_name: String,
    pub cluster_id: String,
    pub ip: String,
    pub pod: String,
    pub namespace: String,
}

impl NodeInfo {
    /// For the node `node_name` and the cluster `cluster_id`, with the
    /// pod's name, namespace and IP from `POD_NAME`, `POD_NAMESPACE` and
    /// `INSTANCE_IP` when set (as ztunnel reads them), else made up from
    /// the node's name.
    pub fn from_env(node_name: &str, cluster_id: &str) -> NodeInfo {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        NodeInfo {
            node_name: node_name.to_string(),
            cluster_id: cluster_id.to_string(),
            ip: env("INSTANCE_IP").unwrap_or_else(|| "0.0.0.0".into()),
            pod: env("POD_NAME").unwrap_or_else(|| format!("ztunnel-{node_name}")),
            namespace: env("POD_NAMESPACE").unwrap_or_else(|| "istio-system".into()),
        }
    }

    /// `ztunnel~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local`,
    /// with NODE_NAME and CLUSTER_ID in the metadata.
    pub fn node(&self) -> Node {
        let ns = &self.namespace;
        Node {
            id: format!("ztunnel~{}~{}.{ns}~{ns}.svc.cluster.local", self.ip, self.pod),
            metadata: Some(string_struct([
                (NODE_NAME, self.node_name.as_str()),
                ("CLUSTER_ID", self.cluster_id.as_str()),
                ("NAME", self.pod.as_str()),
                ("NAMESPACE", ns.as_str()),
                ("INSTANCE_IPS", self.ip.as_str()),
            ])),
            build_version: concat!("slipstream-", env!("CARGO_PKG_VERSION")).into(),
            ..Default::default()
        }
    }
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("{0}")]
    Control(#[from] crate::control::ControlError),
    #[error("{}", describe(.0))]
    Status(#[from] tonic::Status),
    #[error("the control plane ended the stream")]
    Ended,
    /// The proxy's main loop is gone: stop.
    #[error("the node proxy stopped taking updates")]
    Stopped,
}

/// A status with the errors under it (a connection failure's reason is
/// in its sources).
fn describe(s: &tonic::Status) -> String {
    let mut out = format!("{}: {}", s.code(), s.message());
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// The versions of what the proxy holds, by type and name.
type Known = BTreeMap<TypeUrl, BTreeMap<String, String>>;

pub struct XdsClient {
    channel: ControlChannel,
    node: Node,
    backoff: Backoff,
    updates: mpsc::Sender<Update>,
    known: Known,
    /// Types whose first response arrived (ever).
    seen: BTreeSet<TypeUrl>,
    complete: bool,
    /// Unknown type URLs already logged.
    unknown: BTreeSet<String>,
    /// The types it subscribes to.
    types: Vec<TypeUrl>,
}

impl XdsClient {
    /// The client of a node proxy, and the updates its main loop applies.
    pub fn new(channel: ControlChannel, node: &NodeInfo, backoff: Backoff) -> (XdsClient, mpsc::Receiver<Update>) {
        Self::with_types(channel, node, backoff, &TypeUrl::NODE)
    }

    /// A client subscribing to `types` (a waypoint's are
    /// [`TypeUrl::WAYPOINT`]).
    pub fn with_types(
        channel: ControlChannel,
        node: &NodeInfo,
        backoff: Backoff,
        types: &[TypeUrl],
    ) -> (XdsClient, mpsc::Receiver<Update>) {
        // One update at a time: the client waits for each to be applied
        // before it answers the response.
        let (updates, rx) = mpsc::channel(1);
        let client = XdsClient {
            channel,
            node: node.node(),
            backoff,
            updates,
            known: Known::new(),
            seen: BTreeSet::new(),
            complete: false,
            unknown: BTreeSet::new(),
            types: types.to_vec(),
        };
        (client, rx)
    }

    /// Streams until the receiver of updates is dropped.
    pub async fn run(mut self) {
        let mut delay = self.backoff.initial;
        // When the stream went down, and how many attempts since.
        let mut down: Option<(Instant, u32)> = None;
        let mut ever_up = false;
        loop {
            let mut responses = 0u64;
            let end = self.stream(&mut responses, &mut down, &mut ever_up).await;
            if matches!(end, StreamEnd::Stopped) || self.updates.is_closed() {
                return;
            }
            if responses > 0 {
                // A healthy stream: start over from the shortest delay.
                delay = self.backoff.initial;
            }
            match &mut down {
                None => {
                    if ever_up {
                        tracing::warn!("the control plane stream broke ({end}); serving the last configuration, reconnecting");
                    } else {
                        tracing::warn!("cannot reach the control plane ({end}); retrying with backoff up to {:?}", self.backoff.max);
                    }
                    down = Some((Instant::now(), 1));
                }
                Some((_, attempts)) => {
                    *attempts += 1;
                    tracing::debug!(attempts = *attempts, "still no control plane stream: {end}");
                }
            }
            tokio::time::sleep(Backoff::jittered(delay)).await;
            delay = self.backoff.next(delay);
        }
    }

    async fn stream(&mut self, responses: &mut u64, down: &mut Option<(Instant, u32)>, ever_up: &mut bool) -> StreamEnd {
        match self.stream_inner(responses, down, ever_up).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn stream_inner(
        &mut self,
        responses: &mut u64,
        down: &mut Option<(Instant, u32)>,
        ever_up: &mut bool,
    ) -> Result<std::convert::Infallible, StreamEnd> {
        let (requests, rx) = mpsc::channel(TypeUrl::ALL.len() + 1);
        for &t in &self.types {
            let initial = DeltaDiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: t.as_str().into(),
                initial_resource_versions: self.known.get(&t).cloned().unwrap_or_default(),
                ..Default::default()
            };
            requests.try_send(initial).expect("room for the initial requests");
        }
        let req = self.channel.request(ReceiverStream::new(rx))?;
        let mut ads = AggregatedDiscoveryServiceClient::new(self.channel.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES);
        let mut stream = ads.delta_aggregated_resources(req).await?.into_inner();
        loop {
            let resp = stream.message().await?.ok_or(StreamEnd::Ended)?;
            if *responses == 0 {
                match down.take() {
                    Some((since, attempts)) => tracing::info!(
                        attempts,
                        "control plane stream up again after {:.1}s; it sends what changed meanwhile",
                        since.elapsed().as_secs_f64()
                    ),
                    None if !*ever_up => tracing::info!("control plane stream up"),
                    None => tracing::info!("control plane stream up again"),
                }
                *ever_up = true;
            }
            *responses += 1;
            if let Some(answer) = self.handle(resp).await? {
                requests.send(answer).await.map_err(|_| StreamEnd::Ended)?;
            }
        }
    }

    /// Converts, has the proxy apply, records versions; the ACK or NACK.
    async fn handle(&mut self, resp: DeltaDiscoveryResponse) -> Result<Option<DeltaDiscoveryRequest>, StreamEnd> {
        let Some(t) = TypeUrl::parse(&resp.type_url).filter(|t| self.types.contains(t)) else {
            if self.unknown.len() < 16 && self.unknown.insert(resp.type_url.clone()) {
                tracing::warn!(type_url = %resp.type_url, "the control plane sent a type this proxy did not ask for: ignored");
            }
            return Ok(None);
        };
        let Converted { upserts, versions, removals, mut refused } = convert(t, &resp);
        self.seen.insert(t);
        let complete = !self.complete && self.types.iter().all(|t| self.seen.contains(t));
        self.complete |= complete;
        let delta = Delta { type_url: t, upserts, removals, complete };
        let (reply, applied) = oneshot::channel();
        self.updates.send(Update { delta: delta.clone(), reply }).await.map_err(|_| StreamEnd::Stopped)?;
        refused.extend(applied.await.map_err(|_| StreamEnd::Stopped)?);

        let known = self.known.entry(t).or_default();
        for name in &delta.removals {
            known.remove(name);
        }
        let refused_names: BTreeSet<&str> = refused.iter().map(|r| r.name.as_str()).collect();
        for (name, version) in versions {
            if !refused_names.contains(name.as_str()) {
                known.insert(name, version);
            }
        }
        let error_detail = (!refused.is_empty()).then(|| {
            let message = refused.iter().map(|r| format!("{}: {}", r.name, r.reason)).collect::<Vec<_>>().join("; ");
            tracing::warn!(r#type = %t, nonce = %resp.nonce, "refused {} resource(s), keeping their previous versions: {message}", refused.len());
            // INVALID_ARGUMENT, as ztunnel's NACKs.
            Status { code: tonic::Code::InvalidArgument as i32, message, details: vec![] }
        });
        Ok(Some(DeltaDiscoveryRequest { type_url: resp.type_url, response_nonce: resp.nonce, error_detail, ..Default::default() }))
    }
}

/// A response converted to the model, with what could not be.
#[derive(Debug, Default, PartialEq)]
struct Converted {
    upserts: Vec<Upsert>,
    /// Name and version of each upsert.
    versions: Vec<(String, String)>,
    removals: Vec<String>,
    refused: Vec<Refusal>,
}

fn convert(t: TypeUrl, resp: &DeltaDiscoveryResponse) -> Converted {
    let mut out = Converted { removals: resp.removed_resources.clone(), ..Default::default() };
    for r in &resp.resources {
        let refuse = |reason: String| Refusal { name: r.name.clone(), reason };
        let Some(any) = &r.resource else {
            out.refused.push(refuse("resource: missing".into()));
            continue;
        };
        let converted = match t {
            TypeUrl::Address => address_from_any(any).map(|a| match a {
                AddressResource::Workload(w) => (w.uid.clone(), Upsert::Workload(w)),
                AddressResource::Service(s) => (s.key(), Upsert::Service(s)),
            }),
            TypeUrl::Authorization => authorization_from_any(any).map(|p| (p.key(), Upsert::Policy(p))),
            TypeUrl::NetworkPolicy => net_policy_from_any(any).map(|p| (p.key(), Upsert::NetPolicy(p))),
            TypeUrl::Route => slipstream_api::routes::routes_from_any(any).map(|r| (r.service.clone(), Upsert::Routes(r))),
            TypeUrl::Mesh => slipstream_api::mesh::mesh_from_any(any).map(|m| (slipstream_api::MESH_RESOURCE.to_string(), Upsert::Mesh(m))),
        };
        match converted {
            Err(e) => out.refused.push(refuse(e.to_string())),
            // The name is how it is removed later: it must be the one its
            // content is kept under.
            Ok((name, _)) if name != r.name => {
                out.refused.push(refuse(format!("name: the resource is named {:?} but its content names {name:?}", r.name)))
            }
            Ok((name, u)) => {
                out.versions.push((name, r.version.clone()));
                out.upserts.push(u);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_api::convert::{address_any, authorization_any};
    use slipstream_api::discovery::Resource;
    use slipstream_core::policy::{Action, Scope};

    fn workload(name: &str) -> Workload {
        Workload {
            uid: format!("c//Pod/default/{name}"),
            name: name.into(),
            namespace: "default".into(),
            addresses: vec!["10.0.0.1".parse().unwrap()],
            // The wire's default (an absent capacity reads as 1).
            capacity: 1,
            ..Default::default()
        }
    }

    fn resource(name: &str, any: prost_types::Any) -> Resource {
        Resource { name: name.into(), version: format!("v-{name}"), resource: Some(any), ..Default::default() }
    }

    #[test]
    fn responses_convert_or_name_what_is_refused() {
        let w = workload("a");
        let mut bad = slipstream_api::workload::Workload::from(&workload("b"));
        bad.addresses = vec![vec![1, 2, 3]];
        let bad = slipstream_api::workload::Address { r#type: Some(slipstream_api::workload::address::Type::Workload(bad)) };
        let resp = DeltaDiscoveryResponse {
            type_url: TypeUrl::Address.as_str().into(),
            resources: vec![
                resource(&w.uid, address_any(&AddressResource::Workload(w.clone()))),
                resource("c//Pod/default/b", slipstream_api::convert::to_any(TypeUrl::Address, &bad)),
                resource("wrong-name", address_any(&AddressResource::Workload(w.clone()))),
                Resource { name: "empty".into(), ..Default::default() },
            ],
            removed_resources: vec!["default/gone.default.svc.cluster.local".into()],
            ..Default::default()
        };
        let c = convert(TypeUrl::Address, &resp);
        assert_eq!(c.upserts, vec![Upsert::Workload(w.clone())]);
        assert_eq!(c.versions, vec![(w.uid.clone(), format!("v-{}", w.uid))]);
        assert_eq!(c.removals, ["default/gone.default.svc.cluster.local"]);
        let refused: Vec<(&str, &str)> = c.refused.iter().map(|r| (r.name.as_str(), r.reason.as_str())).collect();
        assert_eq!(
            refused,
            [
                ("c//Pod/default/b", "workload.addresses[0]: an address is 4 or 16 bytes, this one is 3"),
                ("wrong-name", "name: the resource is named \"wrong-name\" but its content names \"c//Pod/default/a\""),
                ("empty", "resource: missing"),
            ]
        );

        let p = Authorization {
            name: "p".into(),
            namespace: "ns".into(),
            scope: Scope::Namespace,
            action: Action::Allow,
            rules: vec![],
            dry_run: false,
        };
        let resp = DeltaDiscoveryResponse {
            type_url: TypeUrl::Authorization.as_str().into(),
            resources: vec![resource("ns/p", authorization_any(&p)), resource("ns/q", address_any(&AddressResource::Workload(w)))],
            ..Default::default()
        };
        let c = convert(TypeUrl::Authorization, &resp);
        assert_eq!(c.upserts, vec![Upsert::Policy(p)]);
        assert_eq!(c.refused.len(), 1);
        assert!(
            c.refused[0].reason.starts_with("resource.type_url: expected type.googleapis.com/istio.security.Authorization"),
            "{:?}",
            c.refused
        );
    }

    #[test]
    fn backoff_doubles_to_its_bound_with_jitter() {
        let b = Backoff::default();
        let mut d = b.initial;
        let mut seen = vec![];
        for _ in 0..10 {
            seen.push(d);
            d = b.next(d);
        }
        assert_eq!(seen[..4], [100, 200, 400, 800].map(Duration::from_millis));
        assert_eq!(*seen.last().unwrap(), Duration::from_secs(15));
        for _ in 0..100 {
            let j = Backoff::jittered(Duration::from_secs(2));
            assert!(j >= Duration::from_secs(1) && j <= Duration::from_secs(2), "{j:?}");
        }
    }

    #[test]
    fn the_node_has_ztunnels_form() {
        let n = NodeInfo {
            node_name: "node1".into(),
            cluster_id: "c1".into(),
            ip: "10.0.0.1".into(),
            pod: "ztunnel-x".into(),
            namespace: "istio-system".into(),
        };
        let node = n.node();
        assert_eq!(node.id, "ztunnel~10.0.0.1~ztunnel-x.istio-system~istio-system.svc.cluster.local");
        assert_eq!(slipstream_api::struct_string(node.metadata.as_ref(), NODE_NAME), Some("node1"));
        assert_eq!(slipstream_api::struct_string(node.metadata.as_ref(), "CLUSTER_ID"), Some("c1"));
    }
}
