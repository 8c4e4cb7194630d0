//! The billing walkthrough (examples/policies/billing) end to end: only
//! frontend may call billing-service on 8080, legacy-service is refused by
//! both layers, `slipstream policy check` explains both answers from the
//! node proxies' own state, every denial shows in the access log and the
//! metrics with its policy and rule, and removing frontend's ALLOW cuts
//! its open connection within a second of the change being acknowledged.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Keeps one HTTP/1.1 connection busy (a request every 0.1 s); prints
/// `open` after the first answer and `closed` when the server side ends it.
const HOLD: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
req = b"GET /healthz HTTP/1.1\r\nHost: billing\r\n\r\n"
opened = False
deadline = time.time() + 30
try:
    while time.time() < deadline:
        s.sendall(req)
        if not s.recv(65536):
            print("closed", flush=True); sys.exit(0)
        if not opened:
            print("open", flush=True); opened = True
        # Not synchronization: the pace at which the connection is used.
        time.sleep(0.1)
    print("timeout", flush=True)
except OSError:
    print("closed", flush=True)
"#;

const URL: &str = "http://billing-service.production:8080/headers";

#[test]
fn only_frontend_calls_billing_and_a_policy_change_cuts_an_open_connection() {
    let dir = repo().join("examples/policies/billing");
    // On nftables capture, so that legacy's refusals reach billing's node
    // proxy and its access log and metrics (what this test is about); on
    // the eBPF datapath the source's kernel refuses first, which
    // ebpf_datapath.rs tests with this same example.
    let c = Cluster::up("t-billing", &["--datapath", "nftables", "-f", &dir.display().to_string()]);
    let curl = |deploy: &str| c.exec("production", deploy, &["curl", "-sS", "--max-time", "3", URL]);

    // As an unprivileged user in each pod: frontend gets through, legacy not.
    let (code, out) = curl("deploy/frontend");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"client_addr\""), "{out}");
    assert_ne!(curl("deploy/legacy-service").0, 0, "legacy-service must be refused");
    // frontend itself only on 8080 (the L4 policy and the ALLOW both say so).
    let tcp = c.exec("production", "deploy/frontend", &["curl", "-sS", "--max-time", "3", "telnet://billing-service.production:9000"]);
    assert_ne!(tcp.0, 0, "port 9000 must be refused");

    // The explanation, from each node proxy's own state; exit 0 for both.
    let check = |from: &str, to: &str| {
        let o = c.run(&["policy", "check", "--from", from, "--to", to, "-o", "json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let ok = check("production/deploy/frontend", "production/deploy/billing-service:8080");
    assert_eq!(ok["verdict"], "allow");
    assert_eq!(ok["ingress"]["network"]["by"]["name"], "billing-l4");
    assert_eq!(ok["ingress"]["network"]["by"]["rule"], "spec.ingress[0]");
    assert_eq!(ok["ingress"]["istio"]["by"]["name"], "billing-allow-frontend");
    assert_eq!(ok["source_identity"], "spiffe://cluster.local/ns/production/sa/frontend-sa");
    let no = check("production/deploy/legacy-service", "production/deploy/billing-service:8080");
    assert_eq!(no["verdict"], "deny");
    assert_eq!(no["ingress"]["network"]["reason"], "no_allow_matched");
    assert_eq!(no["ingress"]["network"]["candidates"][0]["kind"], "CiliumNetworkPolicy");
    let names: Vec<&str> = no["ingress"]["istio"]["candidates"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["billing-allow-frontend", "default-deny"]);
    let human = c.ok(&["policy", "check", "--from", "production/deploy/legacy-service", "--to", "production/deploy/billing-service:8080"]);
    assert!(human.starts_with("DENY"), "{human}");
    // A question about an unknown pod is an error, not an answer.
    let o = c.run(&["policy", "check", "--from", "production/nobody", "--to", "production/deploy/billing-service:8080"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no pod production/nobody"), "{}", text(&o));

    // Every denial is in the access log and the metrics with its policy.
    let log = std::fs::read_to_string("/run/slipstream/t-billing/nodes/node2.log").unwrap();
    assert!(
        log.lines().any(|l| l.contains("src.identity=spiffe://cluster.local/ns/production/sa/legacy-sa")
            && l.contains("flag=DENY")
            && l.contains("CiliumNetworkPolicy production/billing-l4")),
        "{log}"
    );
    let m = Proxy::of(&c, "node2").metrics();
    assert!(
        m.sum("slipstream_policy_denials_total", &["policy_kind=\"CiliumNetworkPolicy\"", "policy_name=\"billing-l4\""]) >= 2,
        "{}",
        m.0
    );
    assert!(
        m.sum("istio_tcp_connections_closed_total", &["response_flags=\"DENY\"", "source_workload=\"legacy-service\""]) >= 1,
        "{}",
        m.0
    );

    // An open connection from frontend, then its ALLOW removed: the
    // namespace's default deny applies to it at once.
    let mut holder = Command::new(bin())
        .args([
            "--cluster",
            "t-billing",
            "exec",
            "-n",
            "production",
            "deploy/frontend",
            "--",
            "python3",
            "-c",
            HOLD,
            "billing-service.production",
            "8080",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let held = Collected::new(holder.stdout.take().unwrap());
    wait_until(Later(|| format!("the connection to be open: {:?}", held.text())), Duration::from_secs(20), || {
        held.text().starts_with("open")
    });
    let allow = dir.join("30-allow-frontend.yaml").display().to_string();
    c.ok(&["delete", "-f", &allow]);
    // `delete` returns once both node proxies acknowledged the change.
    let acked = Instant::now();
    holder.wait().unwrap();
    let took = acked.elapsed();
    assert_eq!(held.finish().trim(), "open\nclosed", "the open connection was cut");
    assert!(took < Duration::from_secs(1), "cut {took:?} after the change was acknowledged");
    assert_ne!(curl("deploy/frontend").0, 0, "new connections are refused too");
    // And back.
    c.ok(&["apply", "-f", &allow]);
    wait_until("frontend allowed again", Duration::from_secs(10), || curl("deploy/frontend").0 == 0);
    c.down();
}
