//! `slipstream observe`: the datapath's flows, as `hubble observe` shows
//! them. The agent keeps the newest flows (named when they happened); a
//! policy drop is explained by the policy engine on the source node
//! proxy's own state, the same answer `slipstream policy check` gives.

use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use slipstream_core::engine;
use slipstream_core::policy::network::{Direction, L4Protocol};
use slipstream_core::MeshState;
use slipstream_testbed::ipc::Flow;
use slipstream_testbed::ipc::{Request, Response};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ObserveArgs {
    /// Flows from this pod: `NAMESPACE/NAME`, `pod:NAMESPACE/NAME` or a
    /// prefix of it (`production/legacy` matches the Deployment's pods).
    #[arg(long = "from-pod", alias = "from")]
    pub from_pod: Option<String>,
    /// Flows to this pod (same forms as --from-pod).
    #[arg(long = "to-pod", alias = "to")]
    pub to_pod: Option<String>,
    /// Flows with either end at this pod (hubble's `--pod`; same forms).
    #[arg(long = "pod")]
    pub pod: Option<String>,
    /// Flows with either end in this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Flows from this namespace (hubble's `--from-namespace`).
    #[arg(long)]
    pub from_namespace: Option<String>,
    /// Flows to this namespace (hubble's `--to-namespace`).
    #[arg(long)]
    pub to_namespace: Option<String>,
    /// Flows with this port at either end.
    #[arg(long)]
    pub port: Option<u16>,
    /// Flows of this protocol: tcp, udp, sctp or icmp (as hubble's
    /// `--protocol`).
    #[arg(long, value_parser = ["tcp", "udp", "sctp", "icmp", "TCP", "UDP", "SCTP", "ICMP"])]
    pub protocol: Option<String>,
    /// FORWARDED, REDIRECTED (to the node proxy) or DROPPED.
    #[arg(long, value_parser = ["FORWARDED", "REDIRECTED", "DROPPED", "forwarded", "redirected", "dropped"])]
    pub verdict: Option<String>,
    /// `drop` (drops only) or `trace` (everything else).
    #[arg(long = "type", value_parser = ["drop", "trace"])]
    pub kind: Option<String>,
    /// Keep printing flows as they happen (Ctrl-C to stop).
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// How many of the newest flows to print first (default 20; without
    /// --follow, 0 means all that are kept).
    #[arg(long)]
    pub last: Option<usize>,
    /// `compact` (one line per flow) or `json` (one object per line).
    #[arg(short = 'o', long = "output", default_value = "compact", value_parser = ["compact", "json"])]
    pub output: String,
}

/// A pod filter: `pod:` is Hubble's prefix for a pod.
fn pod_filter(s: &str) -> String {
    s.strip_prefix("pod:").unwrap_or(s).to_string()
}

/// Whether a flow passes the filters (pure, for tests).
pub fn matches(a: &ObserveArgs, f: &Flow) -> bool {
    let pod_ok = |want: &Option<String>, pod: &str| want.as_deref().is_none_or(|w| !pod.is_empty() && pod.starts_with(&pod_filter(w)));
    let verdict_ok = a.verdict.as_deref().is_none_or(|v| v.eq_ignore_ascii_case(&f.verdict));
    let kind_ok = match a.kind.as_deref() {
        Some("drop") => f.verdict == "DROPPED",
        Some("trace") => f.verdict != "DROPPED",
        _ => true,
    };
    // A connect() refused on a Service's address names the Service, not a
    // pod: a pod filter naming it matches (its backends are its pods, as
    // hubble shows the backend Cilium's socket LB picked).
    let to_ok = pod_ok(&a.to_pod, &f.destination.pod) || (f.destination.pod.is_empty() && pod_ok(&a.to_pod, &f.destination.service));
    pod_ok(&a.from_pod, &f.source.pod)
        && to_ok
        && (a.pod.is_none() || pod_ok(&a.pod, &f.source.pod) || pod_ok(&a.pod, &f.destination.pod))
        && a.from_namespace.as_deref().is_none_or(|n| f.source.namespace == n)
        && a.to_namespace.as_deref().is_none_or(|n| f.destination.namespace == n)
        && a.namespace.as_deref().is_none_or(|n| f.source.namespace == n || f.destination.namespace == n)
        && a.port.is_none_or(|p| f.source.port == p || f.destination.port == p)
        && verdict_ok
        && kind_ok
        && a.protocol.as_deref().is_none_or(|p| p.eq_ignore_ascii_case(if f.protocol.is_empty() { "TCP" } else { &f.protocol }))
}

/// The deciding policy of a policy drop, from the source node's state.
struct Explainer<'a> {
    ctx: &'a Ctx,
    states: BTreeMap<String, Option<std::sync::Arc<MeshState>>>,
}

impl Explainer<'_> {
    fn explain(&mut self, f: &Flow) -> Option<String> {
        if f.drop_reason != "POLICY_DENIED" {
            return None;
        }
        let state = self
            .states
            .entry(f.node.clone())
            .or_insert_with(|| crate::cmd::policy::node_state(self.ctx, &f.node).ok().map(|cfg| MeshState::from_config(&cfg).0))
            .as_ref()?;
        let src = state.workload_by_ip(f.source.ip.parse().ok()?)?;
        let dst = state.workload_by_ip(f.destination.ip.parse().ok()?)?;
        let now_allowed = "allowed now (the policy changed since)".to_string();
        let l4 = match f.protocol.as_str() {
            "TCP" | "" => {
                let v = engine::connection(state, &src, &dst, L4Protocol::Tcp, f.destination.port);
                return Some(v.denial().map(|d| d.explain()).unwrap_or(now_allowed));
            }
            "UDP" => L4Protocol::Udp,
            "SCTP" => L4Protocol::Sctp,
            _ => L4Protocol::Any,
        };
        // Not TCP: the network policies alone, as the kernel compiled them
        // (docs/datapath.md, "UDP, ICMP and the rest").
        let c = engine::Connection {
            protocol: l4,
            src_ip: src.address(),
            peer: None,
            dst_ip: dst.address(),
            dst_port: if l4 == L4Protocol::Any { 0 } else { f.destination.port },
        };
        let e = engine::network(state, &src, Direction::Egress, &c);
        let i = engine::network(state, &dst, Direction::Ingress, &c);
        Some(if !e.allowed {
            e.explain()
        } else if !i.allowed {
            i.explain()
        } else {
            now_allowed
        })
    }
}

fn end(e: &slipstream_testbed::agent::flows::Endpoint, with_port: bool) -> String {
    let name = match (e.pod.is_empty(), e.service.is_empty()) {
        (false, _) => e.pod.clone(),
        (true, false) => format!("service {}", e.service),
        _ => e.ip.clone(),
    };
    let mut s = if with_port && e.port != 0 { format!("{name}:{}", e.port) } else { name };
    if !e.identity.is_empty() {
        s.push_str(&format!(" ({})", e.identity));
    }
    s
}

/// One compact line (pure, for tests).
pub fn compact(f: &Flow, policy: Option<&str>) -> String {
    let t = humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(f.time_ms));
    let mut s = format!("{t} [{}] {} -> {} {}", f.node, end(&f.source, false), end(&f.destination, true), f.verdict);
    if !f.drop_reason.is_empty() {
        s.push_str(&format!(" {} at {}", f.drop_reason, f.point));
    }
    if !f.protocol.is_empty() && f.protocol != "TCP" {
        s.push_str(&format!(" ({})", f.protocol));
    }
    if let Some(p) = policy {
        s.push_str(&format!(": {p}"));
    }
    s
}

fn fetch(ctx: &Ctx, after: u64) -> anyhow::Result<(Vec<Flow>, String)> {
    match ctx.call(&Request::Flows { after }, Duration::from_secs(10))? {
        Response::Flows { flows, datapath } => Ok((flows, datapath)),
        Response::Rejected { errors } => bail!("the agent refused: {}", errors.join("; ")),
        other => bail!("unexpected answer from the agent (an older agent?): {other:?}"),
    }
}

pub fn run(ctx: &Ctx, a: &ObserveArgs) -> anyhow::Result<()> {
    let (flows, datapath) = fetch(ctx, 0).context("reading the flows from the cluster agent")?;
    if datapath != "ebpf" {
        bail!(
            "cluster {:?} runs the {datapath} datapath, which records no flows: start it with `slipstream up --datapath ebpf`",
            ctx.paths.cluster.as_str()
        );
    }
    let mut explainer = Explainer { ctx, states: BTreeMap::new() };
    let mut last_seq = flows.last().map(|f| f.seq).unwrap_or(0);
    let selected: Vec<&Flow> = flows.iter().filter(|f| matches(a, f)).collect();
    let keep = match (a.last, a.follow) {
        (Some(0), false) => selected.len(),
        (Some(n), _) => n,
        (None, _) => 20,
    };
    let print = |f: &Flow, explainer: &mut Explainer| -> anyhow::Result<()> {
        let policy = explainer.explain(f);
        let line = match a.output.as_str() {
            "json" => {
                let mut v = serde_json::to_value(f)?;
                if let Some(p) = &policy {
                    v["policy"] = serde_json::Value::String(p.clone());
                }
                v.to_string()
            }
            _ => compact(f, policy.as_deref()),
        };
        common::out(&format!("{line}\n"))
    };
    for f in &selected[selected.len().saturating_sub(keep)..] {
        print(f, &mut explainer)?;
    }
    while a.follow && !common::interrupted() {
        std::thread::sleep(Duration::from_millis(200));
        let (flows, _) = fetch(ctx, last_seq)?;
        // States may have changed: explain new drops from fresh ones.
        explainer.states.clear();
        for f in &flows {
            last_seq = last_seq.max(f.seq);
            if matches(a, f) {
                print(f, &mut explainer)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_testbed::agent::flows::Endpoint;

    fn flow(verdict: &str, from: &str, to: &str, port: u16) -> Flow {
        let ep = |pod: &str, port| Endpoint {
            ip: "10.0.0.1".into(),
            port,
            pod: pod.into(),
            namespace: pod.split('/').next().unwrap_or_default().into(),
            identity: String::new(),
            service: String::new(),
        };
        Flow {
            seq: 1,
            time_ms: 0,
            node: "node1".into(),
            source: ep(from, 0),
            destination: ep(to, port),
            verdict: verdict.into(),
            drop_reason: if verdict == "DROPPED" { "POLICY_DENIED".into() } else { String::new() },
            point: "connect".into(),
            protocol: "TCP".into(),
        }
    }

    #[test]
    fn filters_work_as_hubbles() {
        let drop = flow("DROPPED", "production/legacy-service-5lk-x", "production/billing-service-5dw-y", 8080);
        let fwd = flow("REDIRECTED", "production/frontend-8rn-z", "production/billing-service-5dw-y", 8080);
        let a = |f: &dyn Fn(&mut ObserveArgs)| {
            let mut a = ObserveArgs::default();
            f(&mut a);
            a
        };
        let from_legacy = a(&|a| a.from_pod = Some("pod:production/legacy-service".into()));
        assert!(matches(&from_legacy, &drop) && !matches(&from_legacy, &fwd));
        // A drop at connect() to the Service's address.
        let mut to_service = drop.clone();
        to_service.destination.pod = String::new();
        to_service.destination.service = "production/billing-service".into();
        let to_billing = a(&|a| a.to_pod = Some("pod:production/billing-service".into()));
        assert!(matches(&to_billing, &to_service) && matches(&to_billing, &drop));
        let to_other = a(&|a| a.to_pod = Some("pod:production/frontend".into()));
        assert!(!matches(&to_other, &to_service));
        let either = a(&|a| a.pod = Some("pod:production/frontend".into()));
        assert!(matches(&either, &fwd) && !matches(&either, &drop), "--pod: either end");
        let to_billing_ns = a(&|a| a.to_namespace = Some("production".into()));
        assert!(matches(&to_billing_ns, &drop));
        let from_other_ns = a(&|a| a.from_namespace = Some("staging".into()));
        assert!(!matches(&from_other_ns, &drop));
        let mut udp = drop.clone();
        udp.protocol = "UDP".into();
        let only_udp = a(&|a| a.protocol = Some("udp".into()));
        assert!(matches(&only_udp, &udp) && !matches(&only_udp, &drop), "--protocol, case as hubble takes it");
        let to_billing = a(&|a| a.to_pod = Some("production/billing-service".into()));
        assert!(matches(&to_billing, &drop) && matches(&to_billing, &fwd));
        let drops = a(&|a| a.kind = Some("drop".into()));
        assert!(matches(&drops, &drop) && !matches(&drops, &fwd));
        let dropped = a(&|a| a.verdict = Some("dropped".into()));
        assert!(matches(&dropped, &drop) && !matches(&dropped, &fwd));
        let ns = a(&|a| a.namespace = Some("default".into()));
        assert!(!matches(&ns, &drop));
        let port = a(&|a| a.port = Some(9000));
        assert!(!matches(&port, &drop));
        let unnamed = Flow { source: Endpoint { pod: String::new(), ..drop.source.clone() }, ..drop.clone() };
        assert!(!matches(&from_legacy, &unnamed), "an address no pod has never matches a pod filter");
    }

    #[test]
    fn a_drop_line_names_both_ends_the_reason_and_the_policy() {
        let f = flow("DROPPED", "production/legacy", "production/billing", 8080);
        let line = compact(&f, Some("no allow rule matched (CiliumNetworkPolicy production/billing-l4)"));
        assert_eq!(
            line,
            "1970-01-01T00:00:00.000Z [node1] production/legacy -> production/billing:8080 DROPPED POLICY_DENIED at connect: no allow rule matched (CiliumNetworkPolicy production/billing-l4)"
        );
    }
}
