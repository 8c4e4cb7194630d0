//! Issue 11, finding 4: IPv6 is not a side door around STRICT mTLS.
//!
//! Pods are addressed over IPv4, but every pod interface has an IPv6
//! link-local address and the sample apps listen on `[::]`. Capture and
//! policy are IPv4, so a meshed pod's interface refuses IPv6 both ways
//! (nftables capture's rules, or the eBPF datapath's programs).
//! The test proves the refusal comes from there (its counters move, and
//! the same request to an unmeshed pod over IPv6 succeeds), and that IPv4
//! plaintext is refused by STRICT at the same time.

mod common;

use common::*;
use std::process::Command;

const MANIFEST: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: outside}
---
apiVersion: v1
kind: Pod
metadata: {name: echo, namespace: default}
spec:
  nodeName: node1
  containers: [{name: echo, command: [slipstream, app, echo]}]
---
apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: outside}
spec:
  nodeName: node1
  containers: [{name: echo, command: [slipstream, app, echo]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: default}
spec:
  mtls: {mode: STRICT}
"#;

fn sh(netns: &str, args: &[&str]) -> (i32, String) {
    let o = Command::new("ip").args(["netns", "exec", netns]).args(args).output().expect("ip netns exec");
    (o.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// The IPv6 link-local address of a pod's eth0.
fn link_local(pod_netns: &str) -> String {
    let (code, out) = sh(pod_netns, &["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"]);
    assert_eq!(code, 0, "{out}");
    let addr = out
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .unwrap_or_else(|| panic!("no IPv6 link-local address on eth0 of {pod_netns}: {out}"));
    addr.split('/').next().unwrap().to_string()
}

/// Packets the pod's IPv6 refusal counted so far: on the nftables datapath
/// the capture table's chain (both rules); on the eBPF one the node's
/// `IPV6` drop counter (the tc programs and connect6/sendmsg6, both ways).
fn guard_hits(c: &Cluster, pod_netns: &str, chain: &str) -> u64 {
    if c.status()["nodes"][0]["datapath"]["mode"] == "ebpf" {
        return Proxy::of(c, "node1").metrics().sum("slipstream_datapath_drops_total", &["reason=\"IPV6\""]);
    }
    let (code, out) = sh(pod_netns, &["nft", "list", "chain", "inet", "slipstream_mesh", chain]);
    assert_eq!(code, 0, "{out}");
    out.lines().filter_map(|l| l.split_whitespace().skip_while(|w| *w != "packets").nth(1)?.parse::<u64>().ok()).sum()
}

#[test]
fn strict_mtls_holds_over_ipv6_too() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_manifest(&dir, "v6.yaml", MANIFEST);
    let c = Cluster::up("t-v6", &["--nodes", "1", "-f", &m]);
    let st = c.status();
    let pod = |name: &str| st["pods"].as_array().unwrap().iter().find(|p| p["name"] == name).cloned().unwrap();
    let (echo, plain) = (pod("echo"), pod("plain"));
    assert_eq!(echo["meshed"], true);
    assert_eq!(plain["meshed"], false);
    let node_ns = st["nodes"][0]["netns"].as_str().unwrap().to_string();
    let veth = |p: &serde_json::Value| format!("vp{}", p["ip"].as_str().unwrap().rsplit('.').next().unwrap());
    let url6 = |p: &serde_json::Value| format!("http://[{}%{}]:8080/healthz", link_local(p["netns"].as_str().unwrap()), veth(p));
    let curl = |args: &[&str]| {
        let mut a = vec!["curl", "-sS", "-g", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"];
        a.extend_from_slice(args);
        sh(&node_ns, &a)
    };

    // Control: over IPv6 the unmeshed pod's app answers, so the path itself
    // works (once duplicate address detection has finished on the new links).
    wait_until("IPv6 to the unmeshed pod works (else this test proves nothing)", std::time::Duration::from_secs(10), || {
        curl(&[&url6(&plain)]) == (0, "200".to_string())
    });
    // ... and the meshed pod's address is just as settled.
    let echo_ns = echo["netns"].as_str().unwrap().to_string();
    wait_until("the meshed pod's link-local address leaves the tentative state", std::time::Duration::from_secs(10), || {
        !sh(&echo_ns, &["ip", "-6", "addr", "show", "dev", "eth0"]).1.contains("tentative")
    });

    // IPv4 plaintext to the meshed pod: refused by STRICT.
    let (code, out) = curl(&[&format!("http://{}:8080/healthz", echo["ip"].as_str().unwrap())]);
    assert_ne!(code, 0, "STRICT must refuse IPv4 plaintext: {out}");

    // IPv6 plaintext to the meshed pod: refused at once by the pod's guard.
    let before = guard_hits(&c, &echo_ns, "ipv6_in");
    let started = std::time::Instant::now();
    let (code, out) = curl(&[&url6(&echo)]);
    assert_ne!(code, 0, "plaintext over IPv6 reached a meshed app under STRICT: {out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "the refusal must be a reset, not a timeout: {out}");
    assert!(guard_hits(&c, &echo_ns, "ipv6_in") > before, "the IPv6 guard of the meshed pod did not count the refusal");

    // Nor can the meshed app itself send IPv6 around the mesh.
    let out_before = guard_hits(&c, &echo_ns, "ipv6_out");
    let (code, _) = c.exec("default", "echo", &["curl", "-sS", "-g", "--max-time", "3", "http://[fe80::1%eth0]:80/"]);
    assert_ne!(code, 0);
    assert!(guard_hits(&c, &echo_ns, "ipv6_out") > out_before, "IPv6 leaving the meshed pod was not refused by its guard");

    // Loopback IPv6 inside the meshed pod still works (the app listens on [::]).
    let (code, out) = c.exec(
        "default",
        "echo",
        &["curl", "-sS", "-g", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://[::1]:8080/healthz"],
    );
    assert_eq!((code, out.as_str()), (0, "200"));
    c.down();
}
