//! The control plane in the local cluster: node proxies take their mesh and
//! certificates from it over delta xDS; they keep serving while it is
//! gone, converge when it returns, and fail over between replicas;
//! `proxy-status`, `proxy-config` and `apply` show and wait for what each
//! proxy acknowledged.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A client process in the client pod that holds one TCP connection to the
/// echo service, echoes a line every 100 ms for `secs` seconds, and prints
/// `echoed N` (or the error that broke it).
fn hold_one(c: &Cluster, secs: u32) -> std::process::Child {
    let script = format!(
        "import socket,time,sys\n\
         s=socket.create_connection(('echo',9000),timeout=5)\n\
         n=0\n\
         end=time.time()+{secs}\n\
         print('open',flush=True)\n\
         while time.time()<end:\n\
         \x20 m=('line %d\\n'%n).encode(); s.sendall(m); got=b''\n\
         \x20 while len(got)<len(m):\n\
         \x20   d=s.recv(64)\n\
         \x20   if not d: print('closed by peer after',n,flush=True); sys.exit(1)\n\
         \x20   got+=d\n\
         \x20 assert got==m, got\n\
         \x20 n+=1; time.sleep(0.1)\n\
         print('echoed',n,flush=True)\n"
    );
    Command::new(bin())
        .args(["--cluster", &c.name, "exec", "deploy/client", "--", "python3", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn curl_echo(c: &Cluster) -> bool {
    c.exec("default", "deploy/client", &["curl", "-s", "--max-time", "5", "http://echo:8080/headers"]).0 == 0
}

fn control_pid(c: &Cluster, name: &str) -> i32 {
    let st = c.status();
    let ctl = st["control"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no {name} in {st}"));
    ctl["process"]["pid"].as_i64().unwrap_or_else(|| panic!("{name} not running: {ctl}")) as i32
}

fn proxy_status(c: &Cluster) -> Vec<Value> {
    serde_json::from_str(&c.ok(&["proxy-status", "-o", "json"])).unwrap()
}

/// The replica each node's proxy is connected to, from proxy-status.
fn connected_to(c: &Cluster, node: &str) -> Option<String> {
    proxy_status(c).iter().find_map(|r| {
        let replica = r["replica"].as_str()?.to_string();
        r["proxies"].as_array()?.iter().any(|p| p["node"] == node).then_some(replica)
    })
}

const EXTRA_POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: late, namespace: default, labels: {app: late}}
spec:
  nodeName: node1
  containers:
  - name: late
    image: slipstream
    command: [slipstream, app, echo, --http-port, '8081', --tcp-port, '9001']
    securityContext: {runAsUser: 65532, runAsGroup: 65532, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    ports: [{containerPort: 8081}]
    readinessProbe:
      httpGet: {path: /healthz, port: 8081}
";

#[test]
fn proxies_keep_serving_without_the_control_plane_and_converge_when_it_returns() {
    let c = Cluster::up("t-ctl-outage", &[]);
    // Everyone connected and in sync, and the tools say so.
    let ps = c.ok(&["proxy-status"]);
    for node in ["node1", "node2"] {
        assert!(ps.lines().any(|l| l.starts_with(node) && l.contains("control1") && l.contains("SYNCED")), "{ps}");
    }
    let workloads = c.ok(&["proxy-config", "node1", "workloads"]);
    assert!(workloads.contains("spiffe://cluster.local/ns/default/sa/echo") && workloads.contains("HBONE"), "{workloads}");
    let certs = c.ok(&["proxy-config", "node2", "certs"]);
    assert!(certs.contains("spiffe://cluster.local/ns/default/sa/echo") && certs.contains("VALID"), "{certs}");
    // Only the control plane reads the CA's key: no node proxy was given it.
    let nodes = c.status()["nodes"].as_array().unwrap().clone();
    for n in &nodes {
        let pid = n["proxy"]["pid"].as_i64().unwrap();
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap().replace('\0', " ");
        assert!(!cmdline.contains("root-key") && !cmdline.contains("--ca-dir"), "{cmdline}");
    }

    // An established connection, held across the outage.
    let mut held = hold_one(&c, 15);
    let mut out = BufReader::new(held.stdout.take().unwrap()).lines();
    assert_eq!(out.next().unwrap().unwrap(), "open");

    // The control plane stops answering (frozen: its connections stay
    // open, so nothing tells the proxies; the agent's probe will find it).
    let pid = control_pid(&c, "control1");
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    // New connections keep working: proxies use what they hold.
    for _ in 0..3 {
        assert!(curl_echo(&c), "a new connection failed while the control plane was down");
        std::thread::sleep(Duration::from_millis(300));
    }
    // A pod created meanwhile cannot be served yet...
    let dir = tempfile::tempdir().unwrap();
    let f = write_manifest(&dir, "late.yaml", EXTRA_POD);
    c.ok(&["apply", "-f", &f, "--no-wait"]);
    std::thread::sleep(Duration::from_secs(2));
    let late = c.pods("late");
    assert_eq!(late[0]["ready"], false, "the new pod cannot be ready without the control plane: {late:?}");
    // ... and `apply` says which proxies have not acknowledged it.
    let o = c.run(&["apply", "-f", &f, "--timeout", "2s"]);
    assert!(!o.status.success(), "{}", text(&o));
    // Thaw it (or the agent has replaced it by now): it converges.
    let _ = Command::new("kill").args(["-CONT", &pid.to_string()]).status();
    wait_until("the late pod ready", Duration::from_secs(60), || c.pods("late").first().is_some_and(|p| p["ready"] == true));
    let ip = c.pods("late")[0]["ip"].as_str().unwrap().to_string();
    let (code, _) = c.exec("default", "deploy/client", &["curl", "-s", "--max-time", "5", &format!("http://{ip}:8081/healthz")]);
    assert_eq!(code, 0, "the pod created during the outage is reachable once the control plane is back");
    // And `apply` now waits for and reports every acknowledgement.
    let o = c.ok(&["apply", "-f", &f]);
    assert!(o.contains("configuration acknowledged by 2 node proxies"), "{o}");

    // Killed outright this time: new connections keep working, the agent
    // starts it again, and a pod created while it was gone converges.
    let pid = control_pid(&c, "control1");
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    assert!(curl_echo(&c), "a new connection failed with the control plane killed");
    let f = write_manifest(&dir, "later.yaml", &EXTRA_POD.replace("late", "later"));
    c.ok(&["apply", "-f", &f, "--no-wait"]);
    wait_until("the control plane started again", Duration::from_secs(60), || {
        let st = c.status();
        st["control"][0]["process"]["pid"].as_i64().is_some_and(|p| p != pid as i64)
    });
    wait_until("the pod created while it was killed ready", Duration::from_secs(60), || {
        c.pods("later").first().is_some_and(|p| p["ready"] == true)
    });
    let ip = c.pods("later")[0]["ip"].as_str().unwrap().to_string();
    let (code, _) = c.exec("default", "deploy/client", &["curl", "-s", "--max-time", "5", &format!("http://{ip}:8081/healthz")]);
    assert_eq!(code, 0, "the pod created while the control plane was killed is reachable once it is back");

    // The held connection never broke.
    let last = out.next().unwrap().unwrap();
    assert!(last.starts_with("echoed "), "the established connection broke: {last}");
    assert!(held.wait().unwrap().success());
    c.down();
}

#[test]
fn proxies_fail_over_between_control_plane_replicas() {
    let c = Cluster::up("t-ctl-failover", &["--control-replicas", "2"]);
    let st = c.status();
    assert_eq!(st["control"].as_array().unwrap().len(), 2, "{st}");
    let first = connected_to(&c, "node1").expect("node1 connected");
    // Kill the replica node1 uses: it reconnects to the other at once.
    let pid = control_pid(&c, &first);
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    wait_until("node1 connected to the other replica", Duration::from_secs(20), || connected_to(&c, "node1").is_some_and(|r| r != first));
    assert!(curl_echo(&c));
    // Changes still reach every proxy (through whichever replica it uses).
    let dir = tempfile::tempdir().unwrap();
    let f = write_manifest(&dir, "late.yaml", EXTRA_POD);
    let o = c.ok(&["apply", "-f", &f]);
    assert!(o.contains("configuration acknowledged by 2 node proxies"), "{o}");
    c.down();
}
