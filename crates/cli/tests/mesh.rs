//! The mesh end to end: meshed pods on two nodes talk through the node
//! proxies in HBONE/mTLS. Proves with a packet capture that only TLS to
//! :15008 crosses the node network, that the server sees the client pod's
//! IP, that access logs carry both SPIFFE identities and that metric counts
//! are exact; and PeerAuthentication STRICT/PERMISSIVE.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
const ECHO_ID: &str = "spiffe://cluster.local/ns/default/sa/echo";

/// Sends `size` bytes to HOST:PORT, half-closes, reads the echo to EOF and
/// prints how many bytes came back (run inside a pod).
const ECHO_CLIENT: &str = r#"
import socket, sys
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port), timeout=10)
s.sendall(b"x" * size)
s.shutdown(socket.SHUT_WR)
n = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    n += len(b)
print(n)
"#;

/// Holds a connection open, echoing a byte every 0.2 s; prints `open` once
/// the first byte came back, then `closed` when the other side closes it
/// (or `timeout` after 20 s).
const HOLD_OPEN: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
deadline = time.time() + 20
opened = False
try:
    while time.time() < deadline:
        s.sendall(b"x")
        if not s.recv(1):
            print("closed"); sys.exit(0)
        if not opened:
            print("open", flush=True)
            opened = True
        # Not synchronization: the pace at which the connection is probed.
        time.sleep(0.2)
    print("timeout")
except OSError:
    print("closed")
"#;

fn metrics(cluster: &str, node: &str) -> String {
    let o = Command::new("ip")
        .args(["netns", "exec", &format!("{cluster}.node.{node}"), "curl", "-sS", "--max-time", "5", "http://127.0.0.1:15020/metrics"])
        .output()
        .unwrap();
    assert!(o.status.success(), "metrics of {node}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// Sum of a metric over the series whose labels contain every `must`.
fn metric(text: &str, name: &str, must: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && must.iter().all(|m| l.contains(m)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn node_log(cluster: &str, node: &str) -> String {
    std::fs::read_to_string(format!("/run/slipstream/{cluster}/nodes/{node}.log")).unwrap_or_default()
}

// one cluster brought up once (slow): encryption, identities and exact metrics are checked on the same traffic.
#[allow(clippy::too_many_lines)]
#[test]
fn quickstart_is_encrypted_across_nodes_with_verified_identities_and_exact_metrics() {
    let qs = repo().join("examples/quickstart").display().to_string();
    let c = Cluster::up("t-mesh", &["-f", &qs]);
    let client = &c.pods("client-")[0];
    let echo = &c.pods("echo-")[0];
    assert_eq!(client["meshed"], true);
    assert_eq!(echo["meshed"], true);
    let st = c.status();
    for n in st["nodes"].as_array().unwrap() {
        assert!(n["proxy"]["pid"].as_i64().is_some(), "a node proxy runs on {}", n["name"]);
        assert_eq!(n["proxy"]["serving"], 1);
    }

    // Capture the node network while the client talks to the server.
    let mut cap = Command::new("ip")
        .args(["netns", "exec", "t-mesh.fabric", "tcpdump", "-i", "fabric", "-nn", "-l", "-A", "-s", "0", "tcp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (scripts/setup.sh installs it)");
    let (dump, cap_log) = (Collected::new(cap.stdout.take().unwrap()), Collected::new(cap.stderr.take().unwrap()));
    // tcpdump says so once the capture is active.
    wait_until(Later(|| format!("tcpdump to listen on the fabric: {}", cap_log.text())), Duration::from_secs(10), || {
        cap_log.text().contains("listening on fabric")
    });
    let canary = "plaintext-canary-7f3a9";
    let (code, out) = c.exec(
        "default",
        "deploy/client",
        &["curl", "-sS", "--max-time", "5", "-H", &format!("X-Canary: {canary}"), "http://echo:8080/headers"],
    );
    assert_eq!(code, 0, "{out}");
    let headers: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The app sees the client pod's own address, not a proxy's.
    let seen = headers["client_addr"].as_str().unwrap();
    assert!(seen.starts_with(&format!("{}:", client["ip"].as_str().unwrap())), "server saw {seen}");
    assert_eq!(headers["headers"]["x-canary"], canary, "the request arrived intact");
    // A marker after the exchange: a connection attempt from node1 to
    // node2's own address on :15008, where nothing listens (the HBONE
    // listeners are in the pods). tcpdump prints packets in the order it
    // captured them: once the marker's SYN is printed, so is every packet
    // of the exchange.
    let node2_ip = st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap()["ip"].as_str().unwrap().to_string();
    let marker = format!(" > {node2_ip}.15008: Flags [S]");
    let _ = Command::new("ip")
        .args(["netns", "exec", "t-mesh.node.node1", "curl", "-sS", "--max-time", "2", &format!("http://{node2_ip}:15008/")])
        .output();
    wait_until("tcpdump to print the marker sent after the exchange", Duration::from_secs(10), || dump.text().contains(&marker));
    let _ = Command::new("kill").arg(cap.id().to_string()).status();
    cap.wait().unwrap();
    let dump = dump.finish();
    assert!(!dump.contains(canary), "application bytes crossed the node network in plaintext");
    let packets: Vec<&str> = dump.lines().filter(|l| l.contains(" IP ")).collect();
    assert!(!packets.is_empty(), "the capture saw the connection");
    for p in &packets {
        assert!(p.contains(".15008 >") || p.contains(".15008:"), "only HBONE (port 15008) crosses between nodes: {p}");
    }

    // Access logs on both sides name both identities, and the addresses as
    // Istio's ztunnel does for HBONE: dst.addr is where the tunnel goes
    // (the pod's :15008), dst.hbone_addr what it carries (the pod's :8080,
    // the service's target port, not the service's address).
    let echo_ip = echo["ip"].as_str().unwrap();
    let (tunnel, target) = (format!("dst.addr={echo_ip}:15008 "), format!("dst.hbone_addr={echo_ip}:8080 "));
    // The lines are written when the connection closes, just after curl.
    for (node, direction) in [("node1", "direction=outbound"), ("node2", "direction=inbound")] {
        wait_until(
            Later(|| format!("the {direction} access-log line on {node}:\n{}", node_log("t-mesh", node))),
            Duration::from_secs(10),
            || node_log("t-mesh", node).lines().any(|l| l.starts_with("connection complete") && l.contains(direction)),
        );
    }
    let out_log = node_log("t-mesh", "node1");
    let in_log = node_log("t-mesh", "node2");
    assert!(
        out_log.lines().any(|l| l.contains("direction=outbound")
            && l.contains(&format!("src.identity={CLIENT_ID}"))
            && l.contains(&format!("dst.identity={ECHO_ID}"))
            && l.contains("dst.service=echo.default.svc.cluster.local")
            && l.contains(&tunnel)
            && l.contains(&target)),
        "{out_log}"
    );
    assert!(
        in_log.lines().any(|l| l.contains("direction=inbound")
            && l.contains(&format!("src.identity={CLIENT_ID}"))
            && l.contains(&format!("dst.identity={ECHO_ID}"))
            && l.contains(&tunnel)
            && l.contains(&target)),
        "{in_log}"
    );

    // Exact counts: N connections of S bytes each way through the raw TCP echo.
    let sel = ["destination_service_name=\"echo\"", "connection_security_policy=\"mutual_tls\"", "response_flags=\"-\""];
    let before_src = metrics("t-mesh", "node1");
    let before_dst = metrics("t-mesh", "node2");
    let (n, size) = (5u64, 100_000u64);
    for _ in 0..n {
        let (code, out) = c.exec("default", "deploy/client", &["python3", "-c", ECHO_CLIENT, "echo", "9000", &size.to_string()]);
        assert_eq!((code, out.trim()), (0, size.to_string().as_str()), "echo through the mesh returns every byte");
    }
    let d = |a: &str, b: &str, name: &str, extra: &[&str]| {
        let mut m: Vec<&str> = sel.to_vec();
        m.extend_from_slice(extra);
        metric(a, name, &m) - metric(b, name, &m)
    };
    // Each proxy counts a connection (and its bytes) when it closes.
    wait_until("both proxies to count the echo connections closed", Duration::from_secs(10), || {
        let closed = |node, before: &str, reporter| d(&metrics("t-mesh", node), before, "istio_tcp_connections_closed_total", &[reporter]);
        closed("node1", &before_src, "reporter=\"source\"") >= n && closed("node2", &before_dst, "reporter=\"destination\"") >= n
    });
    let after_src = metrics("t-mesh", "node1");
    let after_dst = metrics("t-mesh", "node2");
    for (after, before, reporter) in
        [(&after_src, &before_src, "reporter=\"source\""), (&after_dst, &before_dst, "reporter=\"destination\"")]
    {
        assert_eq!(d(after, before, "istio_tcp_connections_opened_total", &[reporter]), n, "{reporter} opened");
        assert_eq!(d(after, before, "istio_tcp_connections_closed_total", &[reporter]), n, "{reporter} closed");
        assert_eq!(d(after, before, "istio_tcp_received_bytes_total", &[reporter]), n * size, "{reporter} received");
        assert_eq!(d(after, before, "istio_tcp_sent_bytes_total", &[reporter]), n * size, "{reporter} sent");
    }
    assert!(after_src.contains(&format!("source_principal=\"{CLIENT_ID}\"")));
    assert!(after_dst.contains(&format!("destination_principal=\"{ECHO_ID}\"")));

    // fortio through the mesh, as the client pod's own user (uid 65532):
    // every request answered 200.
    let o = c.run(&[
        "exec",
        "deploy/client",
        "--",
        "fortio",
        "load",
        "-quiet",
        "-c",
        "8",
        "-qps",
        "200",
        "-t",
        "2s",
        "-json",
        "-",
        "http://echo:8080/echo?size=1024",
    ]);
    let (code, out) = (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned());
    assert_eq!(code, 0, "{out}");
    let f: serde_json::Value = serde_json::from_str(&out).expect("fortio json");
    let ok = f["RetCodes"]["200"].as_u64().unwrap_or(0);
    assert!(ok > 100 && ok == f["DurationHistogram"]["Count"].as_u64().unwrap(), "fortio: {}", f["RetCodes"]);

    // The config dump shows this node's pods and their certificates.
    let o = Command::new("ip")
        .args(["netns", "exec", "t-mesh.node.node2", "curl", "-sS", "http://127.0.0.1:15000/config_dump"])
        .output()
        .unwrap();
    let dump: serde_json::Value = serde_json::from_slice(&o.stdout).expect("config_dump is JSON");
    assert!(dump["certificates"].to_string().contains(ECHO_ID), "{}", dump["certificates"]);
    c.down();
}

#[test]
fn a_killed_node_proxy_is_restarted_and_meshed_traffic_fails_closed_meanwhile() {
    let qs = repo().join("examples/quickstart").display().to_string();
    let c = Cluster::up("t-proxykill", &["-f", &qs]);
    let pid = c.status()["nodes"][0]["proxy"]["pid"].as_i64().unwrap();
    // Stop (not kill) the proxy: capture stays, so the app's connection cannot
    // bypass the mesh; it fails instead of leaking plaintext.
    Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    let (code, _) = c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "2", "http://echo:8080/healthz"]);
    assert_ne!(code, 0, "with its proxy stopped, a meshed pod must not reach the server");
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_until("proxy restarted and serving", Duration::from_secs(20), || {
        let n = &c.status()["nodes"][0]["proxy"];
        n["pid"].as_i64().is_some_and(|p| p != pid) && n["restarts"] == 1 && n["serving"] == 1
    });
    wait_until("traffic flows again", Duration::from_secs(10), || {
        c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "2", "http://echo:8080/healthz"]).0 == 0
    });
    c.down();
}

/// The whole cluster runs on nftables capture: this test is about the
/// destination node proxy's refusal. On the eBPF datapath the kernel
/// refuses first, at the source's connect() or at the destination's tc
/// ingress (crates/cli/tests/ebpf_datapath.rs).
const OUTSIDE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: outside, labels: {slipstream.io/datapath: nftables}}
---
apiVersion: v1
kind: Pod
metadata: {name: stranger, namespace: outside}
spec:
  nodeName: node1
  containers: [{name: c, command: [sleep, infinity]}]
"#;

const STRICT: &str = r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: default}
spec:
  mtls: {mode: STRICT}
"#;

const STRICT_EXCEPT_9000: &str = r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: echo-tcp, namespace: default}
spec:
  selector: {matchLabels: {app: echo}}
  portLevelMtls:
    9000: {mode: PERMISSIVE}
"#;

#[test]
fn peer_authentication_strict_refuses_plaintext_from_outside_the_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let qs = repo().join("examples/quickstart").display().to_string();
    let outside = write_manifest(&dir, "outside.yaml", OUTSIDE);
    let c = Cluster::up("t-peerauth", &["--datapath", "nftables", "-f", &qs, "-f", &outside]);
    let stranger = c.status()["pods"].as_array().unwrap().iter().find(|p| p["name"] == "stranger").cloned().unwrap();
    assert_eq!(stranger["meshed"], false);
    let echo_ip = c.pods("echo-")[0]["ip"].as_str().unwrap().to_string();
    let url = format!("http://{echo_ip}:8080/headers");
    let curl = |ns: &str, pod: &str| c.exec(ns, pod, &["curl", "-sS", "--max-time", "3", &url]);

    // PERMISSIVE (default): plaintext from outside reaches the app, which
    // sees the stranger's own address.
    let (code, out) = curl("outside", "stranger");
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["client_addr"].as_str().unwrap().starts_with(stranger["ip"].as_str().unwrap()));

    // An open plaintext connection (held by a background client that
    // reports when the server closes it) ...
    let mut holder = Command::new(bin())
        .args(["--cluster", "t-peerauth", "exec", "-n", "outside", "stranger", "--", "python3", "-c", HOLD_OPEN, &echo_ip, "9000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let held = Collected::new(holder.stdout.take().unwrap());
    wait_until(Later(|| format!("the plaintext connection to be open: {:?}", held.text())), Duration::from_secs(20), || {
        held.text().lines().next() == Some("open")
    });

    // STRICT: plaintext is refused; the meshed client still gets through.
    let strict = write_manifest(&dir, "strict.yaml", STRICT);
    c.ok(&["apply", "-f", &strict]);
    // ... is closed by the policy change, not left running.
    holder.wait().unwrap();
    assert_eq!(held.finish().trim(), "open\nclosed", "the open plaintext connection was closed when STRICT applied");
    wait_until("STRICT in force", Duration::from_secs(10), || curl("outside", "stranger").0 != 0);
    assert_eq!(curl("default", "deploy/client").0, 0, "mTLS traffic is still allowed");
    let log = node_log("t-peerauth", "node2");
    // A plaintext line (:15006): the address the client dialled, no tunnel.
    assert!(
        log.lines().any(|l| l.contains("plaintext refused")
            && l.contains("flag=DENY")
            && l.contains(&format!("dst.identity={ECHO_ID}"))
            && l.contains(&format!("dst.addr={echo_ip}:8080 "))
            && !l.contains("dst.hbone_addr=")),
        "{log}"
    );
    let m = metrics("t-peerauth", "node2");
    assert!(
        metric(&m, "istio_tcp_connections_closed_total", &["response_flags=\"DENY\"", "connection_security_policy=\"unknown\""]) >= 1,
        "{m}"
    );

    // A port-level exception re-opens plaintext on 9000 only.
    let except = write_manifest(&dir, "except.yaml", STRICT_EXCEPT_9000);
    c.ok(&["apply", "-f", &except]);
    let tcp_echo = |ns: &str, pod: &str| c.exec(ns, pod, &["python3", "-c", ECHO_CLIENT, &echo_ip, "9000", "1000"]);
    wait_until("port 9000 permissive", Duration::from_secs(10), || tcp_echo("outside", "stranger").1.trim() == "1000");
    assert_ne!(curl("outside", "stranger").0, 0, "port 8080 stays STRICT");

    // Removing the policies restores PERMISSIVE.
    c.ok(&["delete", "-f", &strict]);
    c.ok(&["delete", "-f", &except]);
    wait_until("PERMISSIVE again", Duration::from_secs(10), || curl("outside", "stranger").0 == 0);
    c.down();
}
