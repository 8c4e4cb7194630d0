//! The Kubernetes cluster a run measures, through its API server: which
//! nodes the pods go to, the bench's namespaces and objects (made for the
//! run, deleted after it), the pods' readiness and logs, the kubelets'
//! stats. Every call blocks on the bench's own runtime; the decisions are
//! in `objects`, `usage` and `podstart`.

use super::objects;
use super::usage::{self, Sample};
use crate::results::{KubeInfo, KubeNode};
use anyhow::{anyhow, bail, Context};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, LogParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where Slipstream's chart installs it (docs/kubernetes.md).
pub const INSTALL_NS: &str = "slipstream-system";
/// Its node DaemonSet.
pub const NODE_DAEMONSET: &str = "slipstream-node";

pub struct KubeCluster {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    pub kubeconfig: PathBuf,
    pub context: String,
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404)
}

impl KubeCluster {
    /// The cluster of `kubeconfig`'s `context` (default: its current one).
    pub fn connect(kubeconfig: &Path, context: Option<&str>) -> anyhow::Result<KubeCluster> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let kc = Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading the kubeconfig {}", kubeconfig.display()))?;
        let context = context.map(String::from).or_else(|| kc.current_context.clone()).unwrap_or_default();
        let options = KubeConfigOptions { context: Some(context.clone()).filter(|c| !c.is_empty()), ..Default::default() };
        let client = rt.block_on(async {
            let config = kube::Config::from_custom_kubeconfig(kc, &options).await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        Ok(KubeCluster { rt, client, kubeconfig: kubeconfig.to_path_buf(), context })
    }

    fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The API server's version, the two nodes (client's, server's: the
    /// first two schedulable Ready nodes by name) and the mesh's image;
    /// fails when Slipstream's node DaemonSet is not there.
    pub fn discover(&self) -> anyhow::Result<KubeInfo> {
        self.rt.block_on(async {
            let version = self.client.apiserver_version().await.context("asking the API server its version")?;
            let nodes = Api::<Node>::all(self.client.clone()).list(&ListParams::default()).await.context("listing the nodes")?;
            let mut usable: Vec<&Node> = nodes.items.iter().filter(|n| schedulable(n)).collect();
            usable.sort_by_key(|n| n.metadata.name.clone());
            if usable.len() < 2 {
                bail!("the bench needs two schedulable Ready nodes (client and server apart); the cluster has {}", usable.len());
            }
            let ds = self.api::<DaemonSet>(INSTALL_NS).get_opt(NODE_DAEMONSET).await?.ok_or_else(|| {
                anyhow!("Slipstream is not installed: no DaemonSet {INSTALL_NS}/{NODE_DAEMONSET} (docs/kubernetes.md, \"Install\")")
            })?;
            let containers = ds.spec.and_then(|s| s.template.spec).map(|s| s.containers).unwrap_or_default();
            let mesh_image = containers.iter().find(|c| c.name == usage::PROXY_CONTAINER).and_then(|c| c.image.clone()).unwrap_or_default();
            let datapath = containers
                .iter()
                .flat_map(|c| c.env.iter().flatten())
                .find(|e| e.name == "SLIPSTREAM_AGENT_DATAPATH")
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| "nftables".into());
            Ok(KubeInfo {
                server_version: version.git_version,
                context: self.context.clone(),
                client_node: usable[0].metadata.name.clone().unwrap_or_default(),
                server_node: usable[1].metadata.name.clone().unwrap_or_default(),
                nodes: usable[..2].iter().map(|n| node_info(n)).collect(),
                mesh_image,
                datapath,
            })
        })
    }

    /// Deletes the namespace if it is left from an earlier run (and waits
    /// until it is gone), then creates it.
    pub fn fresh_namespace(&self, ns: &Value, timeout: Duration) -> anyhow::Result<()> {
        let name = ns["metadata"]["name"].as_str().unwrap_or_default().to_string();
        self.delete_namespaces(&[name.as_str()], timeout)?;
        let obj: Namespace = serde_json::from_value(ns.clone())?;
        self.rt
            .block_on(Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &obj))
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }

    /// Creates a pod, Service or Gateway from its JSON.
    pub fn create(&self, obj: &Value) -> anyhow::Result<()> {
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let what = format!("creating {kind} {ns}/{}", obj["metadata"]["name"].as_str().unwrap_or_default());
        let pp = PostParams::default();
        self.rt
            .block_on(async {
                match kind {
                    "Pod" => self.api::<Pod>(ns).create(&pp, &serde_json::from_value(obj.clone())?).await.map(|_| ()),
                    "Service" => self.api::<Service>(ns).create(&pp, &serde_json::from_value(obj.clone())?).await.map(|_| ()),
                    _ => {
                        let ar = ApiResource::from_gvk(&kube::core::GroupVersionKind::try_from(&serde_json::from_value::<
                            kube::core::TypeMeta,
                        >(obj.clone())?)?);
                        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &ar);
                        api.create(&pp, &serde_json::from_value(obj.clone())?).await.map(|_| ())
                    }
                }
                .map_err(anyhow::Error::from)
            })
            .context(what)
    }

    /// Deletes the namespaces and waits until they are gone.
    pub fn delete_namespaces(&self, names: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let api = Api::<Namespace>::all(self.client.clone());
        self.rt.block_on(async {
            for n in names {
                match api.delete(n, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await {
                    Err(e) if is_not_found(&e) => {}
                    r => {
                        r.with_context(|| format!("deleting namespace {n}"))?;
                    }
                }
            }
            let t0 = Instant::now();
            for n in names {
                while api.get_opt(n).await?.is_some() {
                    if t0.elapsed() > timeout {
                        bail!("namespace {n} is still there {}s after its deletion", timeout.as_secs());
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Ok(())
        })
    }

    pub fn pod(&self, ns: &str, name: &str) -> anyhow::Result<Option<Pod>> {
        Ok(self.rt.block_on(self.api::<Pod>(ns).get_opt(name))?)
    }

    /// Waits until every pod named is Ready; the error says what the last
    /// one not ready was waiting for.
    pub fn wait_ready(&self, ns: &str, pods: &[String], timeout: Duration, stop: &dyn Fn() -> bool) -> anyhow::Result<()> {
        let t0 = Instant::now();
        for name in pods {
            loop {
                let pod = self.pod(ns, name)?;
                if pod.as_ref().is_some_and(ready) {
                    break;
                }
                if stop() {
                    return Err(crate::cluster::Interrupted.into());
                }
                if t0.elapsed() > timeout {
                    let why = pod.as_ref().map(why_not_ready).unwrap_or("missing".into());
                    let event = self.last_warning(ns, name).map(|e| format!("; last warning: {e}")).unwrap_or_default();
                    bail!("pod {ns}/{name} not ready after {}s: {why}{event}", timeout.as_secs());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// The message of the object's latest Warning event, if any.
    fn last_warning(&self, ns: &str, name: &str) -> Option<String> {
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let events = self.rt.block_on(self.api::<Event>(ns).list(&lp)).ok()?;
        events
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
            .and_then(|e| Some(format!("{}: {}", e.reason?, e.message?)))
    }

    /// Pods of a namespace whose names start with `prefix`.
    pub fn pods_named(&self, ns: &str, prefix: &str) -> anyhow::Result<Vec<String>> {
        let list = self.rt.block_on(self.api::<Pod>(ns).list(&ListParams::default()))?;
        Ok(list.items.into_iter().filter_map(|p| p.metadata.name).filter(|n| n.starts_with(prefix)).collect())
    }

    /// A container's log, each line with the runtime's timestamp.
    pub fn log_with_timestamps(&self, ns: &str, pod: &str) -> anyhow::Result<String> {
        let lp = LogParams { timestamps: true, ..Default::default() };
        self.rt.block_on(self.api::<Pod>(ns).logs(pod, &lp)).with_context(|| format!("reading the log of {ns}/{pod}"))
    }

    /// Deletes a pod now; with `wait`, returns once it is gone.
    pub fn delete_pod(&self, ns: &str, name: &str, wait: Option<Duration>) -> anyhow::Result<()> {
        let api = self.api::<Pod>(ns);
        self.rt.block_on(async {
            match api.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await {
                Err(e) if is_not_found(&e) => return Ok(()),
                r => {
                    r?;
                }
            }
            let Some(timeout) = wait else { return Ok(()) };
            let t0 = Instant::now();
            while api.get_opt(name).await?.is_some() {
                if t0.elapsed() > timeout {
                    bail!("pod {ns}/{name} still there {}s after its deletion", timeout.as_secs());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        })
    }

    /// Creates a pod and returns the bench's clock just before the request.
    pub fn create_timed(&self, pod: &Value) -> anyhow::Result<std::time::SystemTime> {
        let obj: Pod = serde_json::from_value(pod.clone())?;
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let api = self.api::<Pod>(ns);
        let at = std::time::SystemTime::now();
        self.rt.block_on(api.create(&PostParams::default(), &obj)).with_context(|| format!("creating pod {ns}/{:?}", obj.metadata.name))?;
        Ok(at)
    }

    /// The mesh containers of the nodes, from their kubelets' summaries.
    pub fn mesh_samples(&self, nodes: &[String], bench_ns: &[&str]) -> anyhow::Result<Vec<Sample>> {
        let mut out = Vec::new();
        for node in nodes {
            let req = http::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary")).body(Vec::new())?;
            let text = self
                .rt
                .block_on(self.client.request_text(req))
                .with_context(|| format!("reading the kubelet's stats summary of {node}"))?;
            let v: Value = serde_json::from_str(&text).context("reading a stats summary")?;
            out.extend(usage::parse(&v, INSTALL_NS, bench_ns));
        }
        out.sort_by(|a, b| a.process.cmp(&b.process));
        Ok(out)
    }
}

fn schedulable(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    let tainted =
        spec.and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute"));
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let is_ready =
        n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    is_ready && !tainted && !cordoned
}

fn node_info(n: &Node) -> KubeNode {
    let st = n.status.clone().unwrap_or_default();
    let info = st.node_info.unwrap_or_default();
    let cap = st.capacity.unwrap_or_default();
    KubeNode {
        name: n.metadata.name.clone().unwrap_or_default(),
        cpus: cap.get("cpu").map(|q| q.0.clone()).unwrap_or_default(),
        memory: cap.get("memory").map(|q| memory_gib(&q.0)).unwrap_or_default(),
        kernel: info.kernel_version,
        os: info.os_image,
        runtime: info.container_runtime_version,
        kubelet: info.kubelet_version,
    }
}

/// A memory quantity as the report writes it: `24684092Ki` -> `23.5 GiB`
/// (binary and decimal suffixes; anything else unchanged).
pub fn memory_gib(q: &str) -> String {
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("", 1.0),
    ];
    units
        .iter()
        .find_map(|(suffix, factor)| q.strip_suffix(suffix).and_then(|n| n.parse::<f64>().ok()).map(|n| n * factor))
        .map(|bytes| format!("{:.1} GiB", bytes / (1024.0 * 1024.0 * 1024.0)))
        .unwrap_or_else(|| q.to_string())
}

fn ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What a pod that is not Ready is waiting for (its phase, and each
/// waiting container's reason).
fn why_not_ready(p: &Pod) -> String {
    let st = p.status.clone().unwrap_or_default();
    let waiting: Vec<String> = st
        .container_statuses
        .unwrap_or_default()
        .iter()
        .filter_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            Some(format!("{}: {} {}", c.name, w.reason.clone().unwrap_or_default(), w.message.clone().unwrap_or_default()))
        })
        .collect();
    format!(
        "phase {}{}",
        st.phase.unwrap_or_default(),
        if waiting.is_empty() { String::new() } else { format!("; {}", waiting.join("; ")) }
    )
}

/// The objects the scenario's namespace holds (its pods and Service, and
/// `l7`'s waypoint).
pub fn scenario_objects(ns: &str, waypoint: bool, info: &KubeInfo) -> Vec<Value> {
    let mut v = Vec::new();
    if waypoint {
        v.push(objects::waypoint(ns));
    }
    v.push(objects::server(ns, &info.server_node));
    v.push(objects::service(ns));
    v.push(objects::client(ns, &info.client_node));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities() {
        let table = [("24684092Ki", "23.5 GiB"), ("8Gi", "8.0 GiB"), ("2147483648", "2.0 GiB"), ("4G", "3.7 GiB"), ("lots", "lots")];
        for (q, want) in table {
            assert_eq!(memory_gib(q), want, "{q}");
        }
    }

    #[test]
    fn scenario_objects_in_creation_order() {
        let info = KubeInfo { client_node: "w1".into(), server_node: "w2".into(), ..Default::default() };
        let kinds = |v: Vec<Value>| {
            v.iter().map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap())).collect::<Vec<_>>()
        };
        assert_eq!(kinds(scenario_objects("a", false, &info)), ["Pod/server", "Service/server", "Pod/client"]);
        assert_eq!(kinds(scenario_objects("a", true, &info))[0], "Gateway/waypoint", "the waypoint first: it takes longest");
    }
}
