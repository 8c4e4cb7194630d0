//! Reaching a Kubernetes install: the API client from a kubeconfig, and an
//! HTTP GET to a port of a pod through the API server's port-forward (as
//! `istioctl` reaches its proxies' admin ports), never to the pod's
//! address: the node proxies' admin listens on 127.0.0.1 only, and the
//! machine running the CLI need not route to pods at all.

use super::http;
use super::target::KubeTarget;
use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one GET through a port-forward may take.
pub const GET_TIMEOUT: Duration = Duration::from_secs(15);

/// The largest answer read (a config dump of a large mesh).
const MAX_BODY: u64 = 64 << 20;

/// A client of one install's API server, and how it was reached.
pub struct Kube {
    pub client: kube::Client,
    /// The kubeconfig context used.
    pub context: String,
    /// The API server's URL.
    pub server: String,
}

/// Runs one command's asynchronous body to its end.
pub fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?.block_on(f)
}

/// The client for `target`: the kubeconfig given, else `KUBECONFIG` (its
/// files merged) or `~/.kube/config`; the context given, else its current one.
pub async fn connect(target: &KubeTarget) -> anyhow::Result<Kube> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kc = match &target.kubeconfig {
        Some(p) => Kubeconfig::read_from(p).with_context(|| format!("reading the kubeconfig {}", p.display()))?,
        None => Kubeconfig::read().context("reading the kubeconfig (KUBECONFIG, or ~/.kube/config)")?,
    };
    let context = target.context.clone().or_else(|| kc.current_context.clone()).unwrap_or_default();
    let options = KubeConfigOptions { context: target.context.clone(), ..Default::default() };
    let config = kube::Config::from_custom_kubeconfig(kc, &options).await.context("loading the kubeconfig")?;
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    Ok(Kube { client, context, server })
}

/// GET `path` on `port` of pod `namespace/name`, through the API server's
/// port-forward: the status code and the body (as text).
pub async fn get(k: &Kube, namespace: &str, name: &str, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let pods: Api<Pod> = Api::namespaced(k.client.clone(), namespace);
    let once = async {
        let mut pf = pods.portforward(name, &[port]).await.with_context(|| format!("port-forward to pod {namespace}/{name}:{port}"))?;
        let errors = pf.take_error(port);
        let mut stream = pf.take_stream(port).context("the port-forward has no stream")?;
        stream.write_all(&http::request(path)).await.context("sending the request")?;
        let mut raw = Vec::new();
        (&mut stream).take(MAX_BODY).read_to_end(&mut raw).await.context("reading the answer")?;
        drop(stream);
        if raw.is_empty() {
            // The kubelet says why on the error channel (connection refused).
            let why = match errors {
                Some(e) => tokio::time::timeout(Duration::from_secs(2), e).await.ok().flatten(),
                None => None,
            };
            pf.abort();
            bail!("no answer on {namespace}/{name}:{port}{path}{}", why.map(|w| format!(": {w}")).unwrap_or_default());
        }
        pf.abort();
        let (code, body) = http::parse(&raw).with_context(|| format!("the answer of {namespace}/{name}:{port}{path}"))?;
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(GET_TIMEOUT, once)
        .await
        .map_err(|_| anyhow::anyhow!("{namespace}/{name}:{port}{path}: no answer within {GET_TIMEOUT:?}"))?
}

/// As [`get`], for a JSON answer that must be 200.
pub async fn get_json<T: serde::de::DeserializeOwned>(k: &Kube, namespace: &str, name: &str, port: u16, path: &str) -> anyhow::Result<T> {
    let (code, body) = get(k, namespace, name, port, path).await?;
    if code != 200 {
        bail!("{namespace}/{name}:{port}{path} answered HTTP {code}: {}", body.lines().next().unwrap_or(""));
    }
    serde_json::from_str(&body).with_context(|| format!("{namespace}/{name}:{port}{path} is not the JSON expected"))
}
