//! `slipstream observe` (`hubble observe`) on Kubernetes. No agent there
//! keeps a flow log: what the install has is every node proxy's access
//! log, one line per connection it carried or refused, read through the
//! API server's pod logs (container `proxy` of each `slipstream-node` pod)
//! and shown as flows, a refusal naming the policy that decided it as the
//! proxy logged it. On the eBPF datapath the node proxies also log what the
//! kernel refused (a denied connect(), a SYN refused at the destination,
//! `node::kernel_drops`); connections the kernel let through are not
//! events of their own (no FORWARDED flows).

use super::reach::{self, Kube};
use super::target::KubeTarget;
use super::{accesslog, install};
use crate::cmd::observe::{compact, matches, ObserveArgs};
use crate::common;
use anyhow::Context;
use futures_util::AsyncBufReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use slipstream_testbed::ipc::Flow;

/// What `observe` says first (on standard error) on Kubernetes.
pub const NOTE: &str = "note: on Kubernetes these are the node proxies' connections, from their access logs through the API server \
(REDIRECTED: carried by a node proxy; DROPPED POLICY_DENIED: refused by one, or by the eBPF datapath's kernel programs, naming the policy)";

/// How many lines of each node proxy's log are read before following.
const TAIL_LINES: i64 = 5000;

fn params(follow: bool) -> LogParams {
    LogParams {
        container: Some(install::PROXY_CONTAINER.into()),
        timestamps: true,
        follow,
        tail_lines: if follow { Some(0) } else { Some(TAIL_LINES) },
        ..Default::default()
    }
}

/// The flows of one node proxy's recent log.
async fn flows_of(k: &Kube, p: &Pod) -> anyhow::Result<Vec<(Flow, Option<String>)>> {
    let (ns, name) = install::key(p);
    let text = Api::<Pod>::namespaced(k.client.clone(), &ns)
        .logs(&name, &params(false))
        .await
        .with_context(|| format!("reading the log of {ns}/{name}"))?;
    Ok(text.lines().filter_map(|l| parse(install::node_of(p), l)).collect())
}

fn parse(node: &str, line: &str) -> Option<(Flow, Option<String>)> {
    let (ms, rest) = accesslog::timestamped(line)?;
    Some(accesslog::flow(node, ms, &accesslog::fields(rest)?))
}

fn print(a: &ObserveArgs, f: &Flow, policy: Option<&str>) -> anyhow::Result<()> {
    let line = match a.output.as_str() {
        "json" => {
            let mut v = serde_json::to_value(f)?;
            if let Some(p) = policy {
                v["policy"] = serde_json::Value::String(p.to_string());
            }
            v.to_string()
        }
        _ => compact(f, policy),
    };
    common::out(&format!("{line}\n"))
}

/// `slipstream observe` on Kubernetes.
pub fn run(t: &KubeTarget, a: &ObserveArgs) -> anyhow::Result<()> {
    eprintln!("{NOTE}");
    reach::block_on(async {
        let k = reach::connect(t).await?;
        let pods: Vec<Pod> = install::pods(&k.client, install::NODE_APP).await?.into_iter().filter(install::running).collect();
        let mut all = Vec::new();
        for r in futures_util::future::join_all(pods.iter().map(|p| flows_of(&k, p))).await {
            match r {
                Ok(f) => all.extend(f),
                Err(e) => eprintln!("warning: {e:#}"),
            }
        }
        all.sort_by_key(|(f, _)| f.time_ms);
        for (i, (f, _)) in all.iter_mut().enumerate() {
            f.seq = i as u64 + 1;
        }
        let selected: Vec<&(Flow, Option<String>)> = all.iter().filter(|(f, _)| matches(a, f)).collect();
        let keep = match (a.last, a.follow) {
            (Some(0), false) => selected.len(),
            (Some(n), _) => n,
            (None, _) => 20,
        };
        for (f, p) in &selected[selected.len().saturating_sub(keep)..] {
            print(a, f, p.as_deref())?;
        }
        if a.follow {
            follow(&k, &pods, a).await?;
        }
        Ok(())
    })
}

/// Every node proxy's log from now on, until Ctrl-C or the streams end.
async fn follow(k: &Kube, pods: &[Pod], a: &ObserveArgs) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Flow, Option<String>)>(1024);
    for p in pods {
        let (ns, name) = install::key(p);
        let node = install::node_of(p).to_string();
        let api = Api::<Pod>::namespaced(k.client.clone(), &ns);
        let tx = tx.clone();
        let stream = api.log_stream(&name, &params(true)).await.with_context(|| format!("following the log of {ns}/{name}"))?;
        tokio::spawn(async move {
            let mut lines = stream.lines();
            use futures_util::StreamExt;
            while let Some(Ok(line)) = lines.next().await {
                if let Some(f) = parse(&node, &line) {
                    if tx.send(f).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    drop(tx);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Some((mut f, p)) => {
                    seq += 1;
                    f.seq = seq;
                    if matches(a, &f) {
                        print(a, &f, p.as_deref())?;
                    }
                }
                None => return Ok(()),
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
