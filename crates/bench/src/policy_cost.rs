//! `slipstream bench-policy`: what authorization costs.
//!
//! 1. The engine alone (a micro-benchmark, in process): the time of one
//!    decision for a workload that 1 000 policies of 10 rules each apply
//!    to, in the Istio layer, the network-policy layer and both, when no
//!    rule matches (every rule is evaluated) and when the very last rule
//!    does.
//! 2. The `denied` scenario of BENCHMARKS.md, in a local cluster: how long
//!    a client waits for its refusal, and what it costs the node proxies
//!    (their CPU time over the attempts): refused at the source's
//!    `connect()` by the eBPF datapath (no packet, no proxy), by the
//!    destination's node proxy (a meshed pod on nftables capture: HBONE
//!    answered 401, the client's connection reset) and by the node's
//!    nftables forward path (a pod outside the mesh on nftables), next to
//!    allowed exchanges.
//!
//! Writes `policy.json` and `policy.md` into --out.

use crate::cluster::{Cluster, Teardown};
use anyhow::Context;
use serde::Serialize;
use slipstream_core::engine::{self, Connection};
use slipstream_core::policy::network::{Direction, L4Protocol, NetKind, NetPeer, NetPolicy, NetPort, NetRule, PortSpec};
use slipstream_core::policy::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};
use slipstream_core::{MeshConfig, MeshState, SpiffeId, TunnelProtocol, Workload};
use std::hint::black_box;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct PolicyBenchArgs {
    /// Policies applying to the one workload, per layer.
    #[arg(long, default_value_t = 1000)]
    pub policies: usize,
    /// Rules per policy.
    #[arg(long, default_value_t = 10)]
    pub rules: usize,
    /// Decisions timed per case.
    #[arg(long, default_value_t = 2000)]
    pub decisions: u32,
    /// Connection attempts per case of the denied scenario.
    #[arg(long, default_value_t = 200)]
    pub connects: u32,
    /// Only the micro-benchmark (no cluster, no root needed).
    #[arg(long)]
    pub no_cluster: bool,
    /// Output directory (default: bench-out/policy-<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MicroCase {
    pub case: String,
    pub verdict: String,
    pub ns_per_decision: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeniedCase {
    pub case: String,
    pub expect: String,
    pub attempts: u32,
    pub refused_or_ok: u32,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// CPU time both node proxies spent while the attempts ran.
    pub proxy_cpu_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyResults {
    pub policies: usize,
    pub rules: usize,
    pub micro: Vec<MicroCase>,
    pub denied: Vec<DeniedCase>,
}

const SERVER_IP: &str = "10.244.2.10";
const CLIENT_IP: &str = "10.244.1.10";

fn workload(name: &str, ip: &str, policies: Vec<String>) -> Workload {
    Workload {
        uid: format!("Kubernetes//Pod/bench/{name}"),
        name: name.into(),
        namespace: "bench".into(),
        addresses: vec![ip.parse().unwrap()],
        node: "node1".into(),
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: name.into(),
        authorization_policies: policies,
        ..Default::default()
    }
}

/// 1 000 ALLOW policies of 10 rules each (a principal and a port per rule)
/// and as many NetworkPolicies (an address and a port per rule), all
/// selecting the server; `last_matches` makes the last rule of the last
/// policy of each layer match the client.
pub fn world(policies: usize, rules: usize, last_matches: bool) -> std::sync::Arc<MeshState> {
    let mut auths = Vec::new();
    let mut nets = Vec::new();
    for i in 0..policies {
        let last = last_matches && i + 1 == policies;
        let rules_ap = (0..rules)
            .map(|j| {
                let principal = if last && j + 1 == rules {
                    "cluster.local/ns/bench/sa/client".to_string()
                } else {
                    format!("cluster.local/ns/bench/sa/p{i}-r{j}")
                };
                Rule {
                    clauses: vec![
                        Clause { matches: vec![Match { principals: vec![StringMatch::Exact(principal)], ..Default::default() }] },
                        Clause {
                            matches: vec![Match {
                                destination_ports: vec![if last && j + 1 == rules { 8080 } else { 8000 + j as u16 }],
                                ..Default::default()
                            }],
                        },
                    ],
                }
            })
            .collect();
        auths.push(Authorization {
            name: format!("p{i:04}"),
            namespace: "bench".into(),
            scope: Scope::WorkloadSelector,
            action: Action::Allow,
            rules: rules_ap,
            dry_run: false,
        });
        let rules_np = (0..rules)
            .map(|j| {
                let peer: IpAddr =
                    if last && j + 1 == rules { CLIENT_IP.parse().unwrap() } else { IpAddr::from([10, 1, (i % 250) as u8, j as u8]) };
                let port = if last && j + 1 == rules { 8080 } else { 8000 + j as u16 };
                NetRule {
                    peers: Some(vec![NetPeer::Addresses(vec![peer])]),
                    ports: Some(vec![NetPort { protocol: L4Protocol::Tcp, port: PortSpec::Range { port, end: port } }]),
                    path: format!("spec.ingress[{j}]"),
                }
            })
            .collect();
        nets.push(NetPolicy {
            kind: NetKind::NetworkPolicy,
            namespace: "bench".into(),
            name: format!("n{i:04}"),
            selected: vec!["Kubernetes//Pod/bench/server".into()],
            isolates_ingress: true,
            ingress: rules_np,
            ..Default::default()
        });
    }
    let listed = auths.iter().map(|a| a.key()).collect();
    let cfg = MeshConfig {
        workloads: vec![workload("server", SERVER_IP, listed), workload("client", CLIENT_IP, vec![])],
        services: vec![],
        policies: auths,
        net_policies: nets,
    };
    let (state, errs) = MeshState::from_config(&cfg);
    assert!(errs.is_empty(), "{errs:?}");
    state
}

/// Times `decisions` decisions of each case.
pub fn micro(policies: usize, rules: usize, decisions: u32) -> Vec<MicroCase> {
    let mut out = Vec::new();
    for last_matches in [false, true] {
        let state = world(policies, rules, last_matches);
        let server = state.workload("Kubernetes//Pod/bench/server").expect("server");
        let client_id = "spiffe://cluster.local/ns/bench/sa/client".parse::<SpiffeId>().expect("id");
        let conn = Connection {
            protocol: L4Protocol::Tcp,
            src_ip: CLIENT_IP.parse().unwrap(),
            peer: Some(&client_id),
            dst_ip: SERVER_IP.parse().unwrap(),
            dst_port: 8080,
        };
        let suffix = if last_matches { "the last rule matches" } else { "no rule matches" };
        let mut time = |case: &str, f: &dyn Fn() -> bool| {
            let allowed = f();
            // Warm up, then time.
            for _ in 0..decisions / 10 {
                black_box(f());
            }
            let start = Instant::now();
            for _ in 0..decisions {
                black_box(f());
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(decisions.max(1));
            out.push(MicroCase {
                case: format!("{case}, {suffix}"),
                verdict: if allowed { "allow" } else { "deny" }.into(),
                ns_per_decision: ns,
            });
        };
        time(&format!("Istio layer ({policies} AuthorizationPolicies x {rules} rules)"), &|| {
            engine::istio(&state, &server, &conn, &mut Vec::new()).allowed
        });
        time(&format!("network layer ({policies} NetworkPolicies x {rules} rules)"), &|| {
            engine::network(&state, &server, Direction::Ingress, &conn).allowed
        });
        time("both layers (the node proxy's inbound decision)", &|| engine::ingress(&state, &server, &conn).allowed());
    }
    out
}

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: bench-denied, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: bench-denied-nft, labels: {istio.io/dataplane-mode: ambient, slipstream.io/datapath: nftables}}
---
apiVersion: v1
kind: Namespace
metadata: {name: bench-denied-plain, labels: {slipstream.io/datapath: nftables}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: bench-denied}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: server, namespace: bench-denied}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: bench-denied-nft}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: server, namespace: bench-denied-nft}
"#;

const NAMESPACES: [&str; 3] = ["bench-denied", "bench-denied-nft", "bench-denied-plain"];

fn pod(ns: &str, name: &str, node: &str, server: bool) -> String {
    let sa = if ns != "bench-denied-plain" { format!("serviceAccountName: {name}, ") } else { String::new() };
    let cmd = if server { "[slipstream, app, echo]" } else { "[sleep, infinity]" };
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {name}}}}}\nspec: {{{sa}nodeName: {node}, containers: [{{name: c, image: slipstream, command: {cmd}, securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}}}]}}\n"
    )
}

/// The policies of the denied scenario: each meshed server refuses its
/// client's identity on 9000 (its TCP echo), allows 8080; the plain server
/// is isolated for ingress on 9000.
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client-9000, namespace: bench-denied}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/bench-denied/sa/client]}}], to: [{operation: {ports: ["9000"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client-9000, namespace: bench-denied-nft}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/bench-denied-nft/sa/client]}}], to: [{operation: {ports: ["9000"]}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-8080-only, namespace: bench-denied-plain}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{ports: [{port: 8080}]}]
"#;

/// Times `n` attempts from inside the client pod: connect, send a line,
/// wait for the echo or the end. Prints one line per attempt: `ok ms` or
/// `refused ms`.
const PROBE: &str = r#"
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    t = time.perf_counter()
    ok = False
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.settimeout(5)
        s.sendall(b"ping\n")
        ok = s.recv(5) == b"ping\n"
        s.close()
    except OSError:
        pass
    print("ok" if ok else "refused", (time.perf_counter() - t) * 1000.0)
"#;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn denied(args: &PolicyBenchArgs, out: &std::path::Path) -> anyhow::Result<Vec<DeniedCase>> {
    let exe = std::env::current_exe().context("finding the slipstream binary")?;
    let cluster = Cluster::new(exe, "bench-policy", out.join("cluster.log"));
    let mut world = MANIFESTS.to_string();
    for ns in NAMESPACES {
        world.push_str(&pod(ns, "client", "node1", false));
        world.push_str(&pod(ns, "server", "node2", true));
    }
    let dir = out.join("manifests");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("world.yaml"), &world)?;
    std::fs::write(dir.join("policies.yaml"), POLICIES)?;
    let _ = cluster.down();
    cluster.up(&dir, 2, Duration::from_secs(120))?;
    let teardown = Teardown::new(&cluster);
    let st = cluster.status()?;
    let ip = |ns: &str| st.pods.iter().find(|p| p.namespace == ns && p.name == "server").map(|p| p.ip.clone()).context("the server pod");
    let ebpf = st.nodes.iter().all(|n| n.datapath.as_ref().is_some_and(|d| d.mode == "ebpf"));
    let proxies: Vec<i32> = st.nodes.iter().filter_map(|n| n.proxy.as_ref().and_then(|p| p.pid)).collect();
    let mut cases = vec![
        ("meshed, allowed (reference: connect and one echo)", "bench-denied", "8080", "ok"),
        (
            "meshed on nftables capture, refused by the destination's node proxy (AuthorizationPolicy DENY: HBONE 401, reset)",
            "bench-denied-nft",
            "9000",
            "refused",
        ),
        ("outside the mesh, allowed (reference)", "bench-denied-plain", "8080", "ok"),
        (
            "outside the mesh on nftables, refused in the node's nftables forward path (NetworkPolicy)",
            "bench-denied-plain",
            "9000",
            "refused",
        ),
    ];
    if ebpf {
        cases.insert(
            1,
            (
                "meshed, refused at the source's connect() by the eBPF datapath (the same DENY, compiled into the kernel)",
                "bench-denied",
                "9000",
                "refused",
            ),
        );
    } else {
        println!("  the cluster runs without the eBPF datapath (see `slipstream --cluster bench-policy status`): no kernel connect() case");
    }
    let mut results = Vec::new();
    for (case, ns, port, expect) in cases {
        let server = ip(ns)?;
        // 8080 is HTTP: the probe's line gets an HTTP error back, which is
        // not its echo; use the TCP echo (9000) and an HTTP GET alike by
        // timing the first answer instead.
        let script =
            if port == "8080" { PROBE.replace("ok = s.recv(5) == b\"ping\\n\"", "ok = len(s.recv(5)) > 0") } else { PROBE.to_string() };
        let argv: Vec<String> =
            ["python3", "-c", &script, &server, port, &args.connects.to_string()].iter().map(|s| s.to_string()).collect();
        let (so, se) = (out.join(format!("{}-{port}.out", ns)), out.join(format!("{}-{port}.err", ns)));
        let cpu0 = proxy_cpu_ms(&proxies);
        let code = cluster.exec(ns, "client", &argv, &so, &se, Duration::from_secs(60 + u64::from(args.connects) * 5))?;
        anyhow::ensure!(code == 0, "the probe failed in {ns}/client: {}", std::fs::read_to_string(&se).unwrap_or_default());
        let cpu_ms = proxy_cpu_ms(&proxies) - cpu0;
        let text = std::fs::read_to_string(&so)?;
        let mut times = Vec::new();
        let mut matched = 0;
        for l in text.lines() {
            let mut it = l.split_whitespace();
            let (Some(what), Some(ms)) = (it.next(), it.next().and_then(|m| m.parse::<f64>().ok())) else { continue };
            if what == expect {
                matched += 1;
            }
            times.push(ms);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        results.push(DeniedCase {
            case: case.into(),
            expect: expect.into(),
            attempts: times.len() as u32,
            refused_or_ok: matched,
            p50_ms: percentile(&times, 50.0),
            p99_ms: percentile(&times, 99.0),
            max_ms: times.last().copied().unwrap_or(f64::NAN),
            proxy_cpu_ms: cpu_ms,
        });
    }
    teardown.finish()?;
    Ok(results)
}

/// User and system CPU time of these processes, in ms (/proc/PID/stat;
/// clock ticks of 10 ms, so a figure under 10 ms reads as 0 or 10).
fn proxy_cpu_ms(pids: &[i32]) -> f64 {
    let tick_ms = 1000.0 / 100.0;
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| {
            // Fields after the command (which may hold spaces) in parentheses.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) * tick_ms)
        })
        .sum()
}

pub fn report(r: &PolicyResults) -> String {
    let mut s = format!(
        "# Policy benchmark\n\nReproduce: `slipstream bench-policy` (root, for the cluster part).\n\n## Engine: one decision, {} policies x {} rules applying to one workload\n\n| case | verdict | ns per decision |\n|---|---|---|\n",
        r.policies, r.rules
    );
    for m in &r.micro {
        s.push_str(&format!("| {} | {} | {:.0} |\n", m.case, m.verdict, m.ns_per_decision));
    }
    if !r.denied.is_empty() {
        s.push_str("\n## Denied scenario: time until the client knows, and what it cost the node proxies\n\n| case | attempts | as expected | p50 ms | p99 ms | max ms | node proxy CPU ms |\n|---|---|---|---|---|---|---|\n");
        for d in &r.denied {
            s.push_str(&format!(
                "| {} | {} | {} ({}) | {:.3} | {:.3} | {:.3} | {:.0} |\n",
                d.case, d.attempts, d.refused_or_ok, d.expect, d.p50_ms, d.p99_ms, d.max_ms, d.proxy_cpu_ms
            ));
        }
    }
    s
}

pub fn run(args: PolicyBenchArgs) -> anyhow::Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/policy-{}", crate::timefmt::compact(std::time::SystemTime::now()))));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!("bench-policy: engine micro-benchmark ({} policies x {} rules per layer)...", args.policies, args.rules);
    let micro = micro(args.policies, args.rules, args.decisions);
    let denied = if args.no_cluster {
        Vec::new()
    } else {
        eprintln!("bench-policy: denied scenario in a local cluster (bench-policy)...");
        denied(&args, &out)?
    };
    let r = PolicyResults { policies: args.policies, rules: args.rules, micro, denied };
    std::fs::write(out.join("policy.json"), serde_json::to_string_pretty(&r)?)?;
    let md = report(&r);
    std::fs::write(out.join("policy.md"), &md)?;
    println!("{md}\nwritten to {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worlds_decide_as_built() {
        let m = micro(20, 3, 10);
        let verdicts: Vec<&str> = m.iter().map(|c| c.verdict.as_str()).collect();
        assert_eq!(verdicts, ["deny", "deny", "deny", "allow", "allow", "allow"], "{m:?}");
        assert!(m.iter().all(|c| c.ns_per_decision > 0.0));
    }
}
