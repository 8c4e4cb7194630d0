//! The semantic cases of crates/control/tests/data/policy-cases.yaml as
//! real traffic: the same world (namespaces, pods, labels, service
//! accounts, named ports) as a local cluster, every case's policies
//! applied, `slipstream policy check` asked against each node proxy's own
//! state until it gives the expected answer, then a real TCP exchange from
//! the client pod (as an unprivileged user) that must get through exactly
//! when the answer is allow.

mod common;
use common::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[path = "../../control/tests/data/cases.rs"]
#[allow(dead_code)]
mod cases;
use cases::WORLD;

/// Sends a line and waits for its echo: `allow` if it came back, `deny` if
/// the connection was refused, reset or closed first.
const PROBE: &str = r#"
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=4)
    s.settimeout(4)
    s.sendall(b"ping\n")
    got = b""
    while len(got) < 5:
        b = s.recv(5 - len(got))
        if not b:
            break
        got += b
    print("allow" if got == b"ping\n" else "deny")
except OSError:
    print("deny")
"#;

/// The world as cluster manifests: each Pod without its status, with a TCP
/// echo on every port a case dials (its declared ports and 8080), running
/// as an unprivileged user; a ServiceAccount per account named.
fn cluster_world() -> (String, BTreeMap<String, String>) {
    let mut out = Vec::new();
    let mut world_ips = BTreeMap::new();
    let mut accounts = std::collections::BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(WORLD) {
        let mut v = serde_yaml::Value::deserialize(doc).unwrap();
        if v["kind"] == "Pod" {
            let ns = v["metadata"]["namespace"].as_str().unwrap().to_string();
            let name = v["metadata"]["name"].as_str().unwrap().to_string();
            world_ips.insert(format!("{ns}/{name}"), v["status"]["podIP"].as_str().unwrap().to_string());
            v.as_mapping_mut().unwrap().remove("status");
            let sa = v["spec"]["serviceAccountName"].as_str().unwrap_or("default").to_string();
            accounts.insert((ns.clone(), sa));
            let declared: Vec<serde_yaml::Value> = v["spec"]["containers"][0]["ports"].as_sequence().cloned().unwrap_or_default();
            let mut ports: Vec<u64> = declared.iter().filter_map(|p| p["containerPort"].as_u64()).collect();
            if !ports.contains(&8080) {
                ports.push(8080);
            }
            let containers: Vec<serde_yaml::Value> = ports
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut c = serde_yaml::from_str::<serde_yaml::Value>(&format!(
                        "{{name: echo{i}, image: slipstream, command: [slipstream, app, echo, --tcp-port, '{p}', --http-port, '{}'], \
                         securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}}}",
                        p + 10000
                    ))
                    .unwrap();
                    if i == 0 {
                        c["ports"] = serde_yaml::Value::Sequence(declared.clone());
                    }
                    c
                })
                .collect();
            v["spec"]["containers"] = serde_yaml::Value::Sequence(containers);
        }
        out.push(serde_yaml::to_string(&v).unwrap());
    }
    for (ns, sa) in accounts.iter().filter(|(_, sa)| sa != "default") {
        out.push(format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n"));
    }
    (out.join("---\n"), world_ips)
}

/// Rewrites the world's addresses in a case to the cluster's.
fn map_addresses(text: &str, map: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (from, to) in map {
        // Whole addresses only: followed by a non-digit or the end.
        let mut next = String::new();
        let mut rest = out.as_str();
        while let Some(i) = rest.find(from.as_str()) {
            let after = rest[i + from.len()..].chars().next();
            next.push_str(&rest[..i]);
            if after.is_some_and(|c| c.is_ascii_digit()) {
                next.push_str(from);
            } else {
                next.push_str(to);
            }
            rest = &rest[i + from.len()..];
        }
        next.push_str(rest);
        out = next;
    }
    out
}

#[test]
fn semantic_cases_as_real_traffic() {
    let cases = cases::load();
    let dir = tempfile::tempdir().unwrap();
    let (world, world_ips) = cluster_world();
    let world_file = write_manifest(&dir, "world.yaml", &world);
    let c = Cluster::up("t-policy", &["-f", &world_file]);
    let st = c.status();
    let mut actual = BTreeMap::new();
    for p in st["pods"].as_array().unwrap() {
        actual
            .insert(format!("{}/{}", p["namespace"].as_str().unwrap(), p["name"].as_str().unwrap()), p["ip"].as_str().unwrap().to_string());
    }
    let mut map = Vec::new();
    for (pod, wip) in &world_ips {
        let aip = actual.get(pod).unwrap_or_else(|| panic!("pod {pod} of the world is not in the cluster: {actual:?}"));
        // Node blocks (10.244.N.0/24) in the cases must hold in the cluster too.
        let net = |ip: &str| ip.rsplit_once('.').unwrap().0.to_string();
        assert_eq!(net(wip), net(aip), "{pod}: the cluster put it in another node block than the world says");
        map.push((wip.clone(), aip.clone()));
    }
    let nodes = ["node1", "node2"];
    let mut failures = Vec::new();
    let started = Instant::now();
    let mut checks = 0;
    for case in &cases.cases {
        let file = (!case.objects.trim().is_empty())
            .then(|| write_manifest(&dir, &format!("{}.yaml", case.id), &map_addresses(&case.objects, &map)));
        if let Some(f) = &file {
            c.ok(&["apply", "-f", f]);
        }
        for chk in &case.checks {
            checks += 1;
            // Both node proxies hold the case's policies: policy check over
            // each one's own state gives the expected answer.
            for node in nodes {
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    let o = c.run(&["policy", "check", "--node", node, "--from", &chk.from, "--to", &chk.to, "-o", "json"]);
                    assert!(o.status.success(), "{}: policy check failed: {}", case.id, text(&o));
                    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                    if v["verdict"] == chk.expect.as_str() {
                        break;
                    }
                    if Instant::now() > deadline {
                        failures.push(format!(
                            "{}: {} -> {}: policy check on {node} says {} (expected {})",
                            case.id, chk.from, chk.to, v["verdict"], chk.expect
                        ));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let (ns, pod) = chk.from.split_once('/').unwrap();
            let (to, port) = chk.to.rsplit_once(':').unwrap();
            let ip = &actual[to];
            let (code, out) = c.exec(ns, pod, &["python3", "-c", PROBE, ip, port]);
            assert_eq!(code, 0, "{}: the probe failed to run: {out}", case.id);
            if out.trim() != chk.expect {
                failures.push(format!("{}: {} -> {}: traffic says {}, expected {}", case.id, chk.from, chk.to, out.trim(), chk.expect));
            }
        }
        if let Some(f) = &file {
            c.ok(&["delete", "-f", f]);
        }
    }
    eprintln!("{} cases, {checks} checks as real traffic in {:?}", cases.cases.len(), started.elapsed());
    assert!(failures.is_empty(), "{} of {checks} checks failed:\n{}", failures.len(), failures.join("\n"));
    c.down();
}
