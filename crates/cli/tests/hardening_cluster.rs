//! Issue 11, findings 6, 8, 9 and 10 (CLI) against real clusters: a stuck
//! node proxy is noticed and restarted, `up` never sweeps running workloads
//! of a dead agent, an expired CA and a too-large apply are refused before
//! anything changes, Ctrl-C during `up` rolls back, and `status` behaves for
//! a non-root user and a closed pipe.

mod common;
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One node, meshed: a client and an echo server behind a service.
const MESH: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: default
  labels: {istio.io/dataplane-mode: ambient}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: client}
spec:
  replicas: 1
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      containers: [{name: client, command: [sleep, infinity]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: echo
        command: [slipstream, app, echo]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: http}]
"#;

fn proxy(c: &Cluster) -> Value {
    c.status()["nodes"][0]["proxy"].clone()
}

/// curl from the client to the echo service, through the mesh.
fn meshed_curl_ok(c: &Cluster) -> bool {
    c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "3", "http://echo:8080/healthz"]).0 == 0
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
}

fn kill(sig: &str, pid: i64) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success(), "kill {sig} {pid}");
}

#[test]
fn a_stuck_node_proxy_is_reported_not_ready_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_manifest(&dir, "mesh.yaml", MESH);
    let c = Cluster::up("t-hc-stuck", &["--nodes", "1", "-f", &m]);
    wait_until("the node proxy to be ready", Duration::from_secs(20), || proxy(&c)["ready"] == true);
    let before = proxy(&c);
    let pid = before["pid"].as_i64().unwrap();
    let restarts = before["restarts"].as_u64().unwrap();
    assert!(meshed_curl_ok(&c), "meshed traffic before the proxy is stopped");

    // Alive but not answering: the kernel still accepts its connections.
    kill("-STOP", pid);
    let mut seen = Value::Null;
    wait_until("status to show the stopped proxy not ready with a reason", Duration::from_secs(20), || {
        seen = proxy(&c);
        seen["pid"] == pid && seen["ready"] == false
    });
    let reason = seen["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.starts_with("readiness probe failed") && reason.contains("timed out"), "{seen}");
    let table = c.ok(&["status"]);
    assert!(table.contains("NOT READY (readiness probe failed"), "{table}");

    // The agent kills it after 3 failures and starts a new one.
    let what = Later(|| {
        let log = std::fs::read_to_string(format!("/run/slipstream/{}/agent.log", c.name)).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        format!("a new, ready node proxy; last status {}; agent log (newest first):\n{}", proxy(&c), tail.join("\n"))
    });
    wait_until(what, Duration::from_secs(40), || {
        let p = proxy(&c);
        p["ready"] == true && p["pid"] != pid
    });
    let after = proxy(&c);
    assert_eq!(after["restarts"].as_u64().unwrap(), restarts + 1, "{after}");
    assert!(!alive(pid), "the stopped proxy {pid} was killed");
    let log = std::fs::read_to_string(format!("/run/slipstream/{}/agent.log", c.name)).unwrap();
    assert!(log.contains("node proxy is alive but not serving (readiness probe failed 3 times"), "{log}");
    wait_until("meshed traffic through the new proxy", Duration::from_secs(20), || meshed_curl_ok(&c));
    c.down();
}

#[test]
fn up_after_the_agent_was_killed_refuses_and_leaves_the_pods_running() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_manifest(&dir, "mesh.yaml", MESH);
    let c = Cluster::up("t-hc-adopt", &["--nodes", "1", "-f", &m]);
    let st = c.status();
    let pids = |st: &Value| -> Vec<i64> {
        let mut v: Vec<i64> = st["pods"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["containers"].as_array().unwrap().iter().map(|c| c["pid"].as_i64().unwrap()))
            .collect();
        v.push(st["nodes"][0]["proxy"]["pid"].as_i64().unwrap());
        v
    };
    let before = pids(&st);
    kill("-9", st["agent"]["pid"].as_i64().unwrap());
    wait_until("status to see the agent gone", Duration::from_secs(10), || c.status()["agent"]["running"] == false);
    let table = c.ok(&["status"]);
    assert!(table.contains("THE CLUSTER AGENT IS NOT RUNNING") && table.contains("last recorded state"), "{table}");

    let o = c.run(&["up", "--nodes", "1", "-f", &m]);
    let t = text(&o);
    assert!(!o.status.success(), "up over running workloads must refuse:\n{t}");
    assert!(t.contains("has no agent, but its workloads are still running") && t.contains("`slipstream down`"), "{t}");
    assert!(t.contains("nothing was changed"), "{t}");
    for pid in &before {
        assert!(alive(*pid), "process {pid} survived the refused up");
    }
    assert_eq!(pids(&c.status()), before);
    assert!(meshed_curl_ok(&c), "meshed traffic still works without the agent");
    c.down();
}

#[test]
fn up_refuses_an_expired_ca_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, "expired test root");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    let cert_path = write_manifest(&dir, "root-cert.pem", &cert.pem());
    let key_path = write_manifest(&dir, "root-key.pem", &key.serialize_pem());
    let m = write_manifest(&dir, "mesh.yaml", MESH);

    require_root();
    let _ = run("t-hc-ca", &["down"]);
    let o = run("t-hc-ca", &["up", "--nodes", "1", "-f", &m, "--ca-cert", &cert_path, "--ca-key", &key_path]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains(&format!("the CA certificate {cert_path} has expired")), "{t}");
    assert!(t.contains("valid from 2020-01-01 00:00:00 UTC to 2021-01-01 00:00:00 UTC"), "{t}");
    assert!(t.contains("nothing was changed"), "{t}");
    assert_clean("t-hc-ca");
}

fn big(replicas: usize) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: big}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: big}}}}\n  template:\n    metadata: {{labels: {{app: big}}}}\n    spec: {{containers: [{{name: c, command: [sleep, infinity]}}]}}\n"
    )
}

const ONE_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: solo}\nspec: {containers: [{name: c, command: [sleep, infinity]}]}\n";

#[test]
fn too_many_replicas_are_refused_at_up_and_at_apply_and_status_behaves() {
    let dir = tempfile::tempdir().unwrap();
    let huge = write_manifest(&dir, "big.yaml", &big(10000));
    require_root();
    let _ = run("t-hc-cap", &["down"]);
    let o = run("t-hc-cap", &["up", "--nodes", "1", "-f", &huge]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains(
            "Deployment default/big: spec.replicas: 10000 pods would exceed the cluster's capacity (1 node x 110 pods = 110, 0 already placed)"
        ),
        "{t}"
    );
    assert!(t.contains("nothing was changed"), "{t}");
    assert_clean("t-hc-cap");

    let solo = write_manifest(&dir, "solo.yaml", ONE_POD);
    let c = Cluster::up("t-hc-cap", &["--nodes", "1", "-f", &solo]);
    let o = c.run(&["apply", "-f", &huge]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("spec.replicas: 10000 pods would exceed the cluster's capacity (1 node x 110 pods = 110, 1 already placed)"), "{t}");
    let st = c.status();
    assert_eq!(st["pods"].as_array().unwrap().len(), 1, "nothing was created: {st}");
    assert_eq!(st["nodes"].as_array().unwrap().len(), 1);

    // A non-root user is told why it cannot see the cluster.
    let o = Command::new("setpriv")
        .args(["--reuid", "1000", "--regid", "1000", "--clear-groups", bin(), "--cluster", &c.name, "status"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("permission denied") && t.contains("sudo"), "{t}");
    assert!(!t.contains("not running"), "{t}");

    // A reader that goes away: no panic, no error.
    let o = Command::new("sh").arg("-c").arg(format!("'{}' --cluster {} status -o json | head -c 10", bin(), c.name)).output().unwrap();
    assert!(o.stderr.is_empty(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "{\n  \"versi", "{}", text(&o));
    for args in [&["status", "-o", "json"][..], &["status"][..], &["logs", "node/node1"][..], &["logs", "pod/solo"][..]] {
        // The pipe's read end is closed before the command writes: EPIPE every time.
        let mut child =
            Command::new(bin()).arg("--cluster").arg(&c.name).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{args:?} with a closed stdout: {}", text(&o));
        assert!(o.stderr.is_empty(), "{args:?} with a closed stdout: {}", text(&o));
    }
    c.down();
}

#[test]
fn ctrl_c_during_up_removes_the_half_built_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // Never ready: `up` waits for it until interrupted.
    let slow = write_manifest(
        &dir,
        "slow.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: slow}\nspec:\n  containers:\n  - name: c\n    command: [sleep, infinity]\n    readinessProbe: {exec: {command: [\"false\"]}}\n",
    );
    require_root();
    let _ = run("t-hc-int", &["down"]);
    let up = Command::new(bin())
        .args(["--cluster", "t-hc-int", "up", "--nodes", "1", "-f", &slow])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _guard = Cluster::adopt("t-hc-int");
    wait_until("the slow pod to be running (up waiting for it)", Duration::from_secs(60), || {
        let o = run("t-hc-int", &["status", "-o", "json"]);
        o.status.success()
            && serde_json::from_slice::<Value>(&o.stdout)
                .is_ok_and(|st| st["agent"]["running"] == true && st["pods"][0]["containers"][0]["state"] == "running")
    });
    kill("-INT", up.id() as i64);
    let started = Instant::now();
    let o = up.wait_with_output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(130), "{t}");
    assert!(t.contains("interrupted: removing the half-built cluster") && t.contains("removed: nothing of it is left"), "{t}");
    assert!(started.elapsed() < Duration::from_secs(45), "rollback took {:?}", started.elapsed());
    assert_clean("t-hc-int");
}
