//! The eBPF datapath in the local cluster (docs/datapath.md): programs
//! loaded, attached and pinned; meshed pods captured with no nftables
//! capture rule; a denied pod's connect() refused by the kernel at once,
//! costing the node proxy nothing, and shown by `observe` with its policy;
//! allowed traffic carried in mTLS; plaintext inbound steered to the proxy;
//! the programs replaced in place under an open connection; the kernel's
//! refusals holding while a node proxy is away; the nftables
//! fallback; nothing pinned after `down`.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

/// Connects `n` times to ADDR:PORT from inside a pod; prints one line per
/// try: the errno name (or `connected`) and the time connect() took, µs.
const CONNECT: &str = r#"
import errno, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    s = socket.socket()
    t = time.perf_counter()
    try:
        s.connect((host, port)); r = "connected"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(r, int((time.perf_counter() - t) * 1e6), flush=True)
    s.close()
"#;

/// Holds one HTTP/1.1 connection to ADDR:8080: a request now and one per
/// line read from stdin, printing `answer N` for each answer.
const HOLD: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], 8080), timeout=5)
n = 0
def ask():
    global n
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: billing\r\n\r\n")
    if not s.recv(65536):
        print("closed", flush=True); sys.exit(1)
    print("answer", n, flush=True); n += 1
ask()
for _ in sys.stdin:
    ask()
"#;

/// A namespace outside the mesh with one client, and a meshed one with an
/// echo server and no policy: for plaintext inbound.
const EXTRA: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: plain}
---
apiVersion: v1
kind: Namespace
metadata: {name: open, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: outsider, namespace: plain}
spec:
  replicas: 1
  selector: {matchLabels: {app: outsider}}
  template:
    metadata: {labels: {app: outsider}}
    spec:
      nodeName: node1
      containers:
      - {name: c, image: curl, command: ["sleep", "infinity"], securityContext: {runAsUser: 65532, runAsGroup: 65532}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: open}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      nodeName: node2
      containers:
      - name: echo
        image: slipstream
        command: ["slipstream", "app", "echo"]
        securityContext: {runAsUser: 65532, runAsGroup: 65532}
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: open}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Namespace
metadata: {name: oldnode, labels: {slipstream.io/datapath: nftables}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: oldclient, namespace: oldnode}
spec:
  replicas: 1
  selector: {matchLabels: {app: oldclient}}
  template:
    metadata: {labels: {app: oldclient}}
    spec:
      nodeName: node1
      containers:
      - {name: c, image: curl, command: ["sleep", "infinity"], securityContext: {runAsUser: 65532, runAsGroup: 65532}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: multi, namespace: open}
spec:
  replicas: 2
  selector: {matchLabels: {app: multi}}
  template:
    metadata: {labels: {app: multi}}
    spec:
      nodeName: node2
      containers:
      - name: echo
        image: slipstream
        command: ["slipstream", "app", "echo"]
        securityContext: {runAsUser: 65532, runAsGroup: 65532}
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: multi, namespace: open}
spec:
  selector: {app: multi}
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

/// Connects to a service by name and holds the connection: prints the
/// address getpeername() answers, then waits for a line on stdin.
const DIAL: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print("%s:%d" % s.getpeername(), flush=True)
sys.stdin.readline()
"#;

fn pod_ip(c: &Cluster, prefix: &str) -> String {
    c.pods(prefix)[0]["ip"].as_str().unwrap().to_string()
}

// one cluster brought up once (slow): capture, refusal and the explanation are checked on it in turn.
#[allow(clippy::too_many_lines)]
#[test]
fn the_kernel_captures_refuses_and_explains() {
    let name = "t-ebpf";
    let tmp = tempfile::tempdir().unwrap();
    let extra = write_manifest(&tmp, "extra.yaml", EXTRA);
    let billing = repo().join("examples/policies/billing").display().to_string();
    let c = Cluster::up(name, &["--datapath", "ebpf", "-f", &billing, "-f", &extra]);
    let st = c.status();
    for n in st["nodes"].as_array().unwrap() {
        assert_eq!(n["datapath"]["mode"], "ebpf", "{n}");
    }
    let table = c.ok(&["status"]);
    assert!(table.contains("DATAPATH") && table.contains("ebpf"), "{table}");

    // Loaded and pinned: the maps, and one link per hook of each pod.
    let dir = Path::new("/sys/fs/bpf/slipstream").join(name);
    for m in ["ss_pods_v1", "ss_ipcache_v1", "ss_policy_v2", "ss_origdst_v3", "ss_listeners_v1", "ss_events_v1", "ss_drops_v1"] {
        assert!(dir.join("maps").join(m).exists(), "{m} not pinned");
    }
    for l in ["connect4", "connect6", "getpeername4", "sendmsg4", "sendmsg6", "sockops", "sock_release"] {
        assert!(dir.join("links/node").join(l).exists(), "no {l} link at the cgroup2 root");
    }
    for p in st["pods"].as_array().unwrap() {
        let key = format!("{}_{}", p["namespace"].as_str().unwrap(), p["name"].as_str().unwrap().replace('.', "_"));
        let on_bpf = p["namespace"] != "oldnode";
        for hook in ["tc_ingress", "tc_egress"] {
            let tc = dir.join("links").join(&key).join(hook);
            assert_eq!(tc.exists(), on_bpf, "{key}: {hook}: policy both ways (and capture when meshed) on every pod of the datapath");
        }
        // No nftables rule in any pod of the datapath: not capture, not the
        // IPv6 refusal (the programs hold it).
        let netns = p["netns"].as_str().unwrap();
        let o = std::process::Command::new("ip").args(["netns", "exec", netns, "nft", "list", "ruleset"]).output().unwrap();
        let rules = String::from_utf8_lossy(&o.stdout);
        if on_bpf {
            assert!(!rules.contains("slipstream"), "{key} has nftables rules on the eBPF datapath:\n{rules}");
        }
    }

    let billing_ip = pod_ip(&c, "billing-service");
    let node1 = Proxy::of(&c, "node1");
    let before = node1.metrics();

    // Allowed: frontend reaches billing, captured at connect() and carried
    // in mTLS by both node proxies (as an unprivileged user in the pod).
    let (code, out) =
        c.exec("production", "deploy/frontend", &["curl", "-sS", "--max-time", "3", &format!("http://{billing_ip}:8080/headers")]);
    assert_eq!(code, 0, "{out}");
    let after_ok = node1.metrics();
    let opened =
        |m: &Metrics| m.sum("istio_tcp_connections_opened_total", &["reporter=\"source\"", "connection_security_policy=\"mutual_tls\""]);
    assert_eq!(opened(&after_ok), opened(&before) + 1, "the allowed connection went through node1's proxy in mTLS");

    // Denied: legacy's connect() fails with EPERM in the kernel, at once,
    // twenty times, without the node proxy seeing any of it.
    let denials = |m: &Metrics| m.sum("slipstream_policy_denials_total", &[]);
    let log_at = node1.log_len();
    let (code, out) = c.exec("production", "deploy/legacy-service", &["python3", "-c", CONNECT, &billing_ip, "8080", "20"]);
    assert_eq!(code, 0, "{out}");
    let lines: Vec<(&str, u64)> = out.lines().map(|l| l.split_once(' ').map(|(r, t)| (r, t.parse().unwrap())).unwrap()).collect();
    assert_eq!(lines.len(), 20, "{out}");
    assert!(lines.iter().all(|(r, _)| *r == "EPERM"), "the kernel refuses at connect(): {out}");
    let mut times: Vec<u64> = lines.iter().map(|(_, t)| *t).collect();
    times.sort_unstable();
    assert!(times[10] < 1000, "a refused connect() takes well under a millisecond (median {} µs): {out}", times[10]);
    let m = node1.metrics();
    assert_eq!(m.sum("slipstream_datapath_drops_total", &["reason=\"POLICY_DENIED\""]), 20, "every refusal counted once");
    assert_eq!(denials(&m), denials(&after_ok), "the node proxy did no work for them");
    assert!(!node1.log_since(log_at).contains("legacy-service"), "no access-log line: the proxy never saw them");

    // Through the service too: every endpoint of billing-service:8080
    // refuses legacy, so its address does at connect().
    let (code, out) = c.exec("production", "deploy/legacy-service", &["python3", "-c", CONNECT, "billing-service.production", "8080", "1"]);
    assert_eq!((code, out.split(' ').next()), (0, Some("EPERM")), "{out}");
    assert_eq!(node1.metrics().sum("slipstream_datapath_drops_total", &["reason=\"POLICY_DENIED\""]), 21);

    // observe names both ends, the reason and the deciding policy.
    let o = c.ok(&[
        "observe",
        "--from-pod",
        "pod:production/legacy-service",
        "--to-pod",
        "production/billing-service",
        "--type",
        "drop",
        "--last",
        "0",
        "-o",
        "json",
    ]);
    let flows: Vec<serde_json::Value> = o.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The twenty to the pod's address, and the one to billing-service's
    // (a pod filter naming the Service matches, as hubble shows backends).
    assert_eq!(flows.len(), 21, "{o}");
    assert_eq!(flows[20]["destination"]["service"], "production/billing-service", "{o}");
    let f = &flows[0];
    assert_eq!(
        (f["verdict"].as_str(), f["dropReason"].as_str(), f["point"].as_str()),
        (Some("DROPPED"), Some("POLICY_DENIED"), Some("connect")),
        "{f}"
    );
    assert_eq!(f["source"]["identity"], "spiffe://cluster.local/ns/production/sa/legacy-sa", "{f}");
    assert_eq!(f["destination"]["port"], 8080, "{f}");
    assert!(f["policy"].as_str().unwrap().contains("CiliumNetworkPolicy production/billing-l4"), "{f}");
    let line = c.ok(&["observe", "--from-pod", "production/legacy-service", "--verdict", "DROPPED", "--last", "1"]);
    assert!(line.contains("DROPPED POLICY_DENIED at connect") && line.contains("production/billing-service"), "{line}");
    let redirected = c.ok(&["observe", "--from-pod", "production/frontend", "--verdict", "REDIRECTED", "--last", "0"]);
    assert!(redirected.contains("production/billing-service"), "{redirected}");

    // At the destination, before any user-space work: a source whose
    // connect() the kernel does not see (its namespace stays on nftables)
    // has its SYN to billing refused at billing's tc ingress, by the
    // identities of both ends, and answered with a reset (the client fails
    // at once); billing's node proxy never hears of it.
    let node2 = Proxy::of(&c, "node2");
    let n2 = node2.metrics();
    let n2_log = node2.log_len();
    let (code, out) = c.exec("oldnode", "deploy/oldclient", &["python3", "-c", CONNECT, &billing_ip, "8080", "3"]);
    assert_eq!(code, 0, "{out}");
    for l in out.lines() {
        let (r, us) = l.split_once(' ').unwrap();
        assert_eq!(r, "ECONNREFUSED", "refused by the destination's kernel with a reset: {out}");
        assert!(us.parse::<u64>().unwrap() < 100_000, "at once, not at a connect timeout: {out}");
    }
    let m2 = node2.metrics();
    let tc_drops = |m: &Metrics| m.sum("slipstream_datapath_drops_total", &["reason=\"POLICY_DENIED\""]);
    assert_eq!(tc_drops(&m2), tc_drops(&n2) + 3, "node2 counts each refused SYN once (no retransmission)");
    assert_eq!(denials(&m2), denials(&n2), "node2's proxy did no work for them");
    assert!(!node2.log_since(n2_log).contains("oldclient"), "no access-log line at the destination");
    let o = c.ok(&["observe", "--from-pod", "oldnode/oldclient", "--type", "drop", "--last", "1"]);
    assert!(o.contains("DROPPED POLICY_DENIED at tc-ingress") && o.contains("production/billing-service"), "{o}");
    assert!(o.contains("billing-l4"), "the deciding policy is named: {o}");

    // Plaintext inbound: a pod outside the mesh reaches a meshed server;
    // tc ingress hands the connection to the destination's node proxy.
    let plain = |m: &Metrics| {
        m.sum(
            "istio_tcp_connections_opened_total",
            &["reporter=\"destination\"", "source_workload=\"outsider\"", "source_principal=\"unknown\""],
        )
    };
    let p0 = plain(&node2.metrics());
    let echo_ip = pod_ip(&c, "echo");
    let (code, out) = c.exec("plain", "deploy/outsider", &["curl", "-sS", "--max-time", "3", &format!("http://{echo_ip}:8080/headers")]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(plain(&node2.metrics()), p0 + 1, "the plaintext connection went through node2's proxy");

    // A new binary replaces the programs in place (what the CNI does when
    // it starts): every pinned link gets a new program, an open connection
    // keeps working, new ones are still captured.
    let link = dir.join("links/node/connect4");
    let prog_id = || -> u64 {
        let o = std::process::Command::new("bpftool").args(["-j", "link", "show", "pinned"]).arg(&link).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("bpftool: {}", text(&o)));
        v["prog_id"].as_u64().unwrap()
    };
    let mut held = std::process::Command::new(bin())
        .args(["--cluster", name, "exec", "-n", "production", "deploy/frontend", "--", "python3", "-c", HOLD, &billing_ip])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_hold = held.stdin.take().unwrap();
    let from_hold = Collected::new(held.stdout.take().unwrap());
    wait_until("the held connection to answer", Duration::from_secs(10), || from_hold.text().contains("answer 0"));
    let before = prog_id();
    let upgraded = slipstream_ebpf::Datapath::load(&dir).expect("a second load replaces the programs");
    assert_ne!(prog_id(), before, "the link runs the new program");
    drop(upgraded);
    use std::io::Write;
    writeln!(to_hold, "again").unwrap();
    wait_until("the held connection to answer after the upgrade", Duration::from_secs(10), || from_hold.text().contains("answer 1"));
    drop(to_hold);
    let _ = held.wait();
    let (code, out) =
        c.exec("production", "deploy/frontend", &["curl", "-sS", "--max-time", "3", &format!("http://{billing_ip}:8080/headers")]);
    assert_eq!(code, 0, "new connections after the upgrade: {out}");

    // Connect-time load balancing for a pod outside the mesh: its socket
    // is connected to the endpoint itself (no per-packet NAT), getpeername()
    // still answers the service address, and the flow names the endpoint.
    let vip = c.status()["services"].as_array().unwrap().iter().find(|s| s["name"] == "echo" && s["namespace"] == "open").unwrap()["vip"]
        .as_str()
        .unwrap()
        .to_string();
    let mut dial = std::process::Command::new(bin())
        .args(["--cluster", name, "exec", "-n", "plain", "deploy/outsider", "--", "python3", "-c", DIAL, "echo.open", "80"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dial_in = dial.stdin.take().unwrap();
    let dialed = Collected::new(dial.stdout.take().unwrap());
    wait_until("getpeername() through the service", Duration::from_secs(10), || dialed.text().contains(':'));
    assert_eq!(dialed.text().trim(), format!("{vip}:80"), "the app sees the address it dialed");
    let outsider_netns = c.pods("outsider")[0]["netns"].as_str().unwrap().to_string();
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", &outsider_netns, "ss", "-tnH", "state", "established", "dst", &format!("{echo_ip}:8080")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1, "the socket is connected to the endpoint: {}", text(&o));
    drop(dial_in);
    let _ = dial.wait();
    let flows = c.ok(&["observe", "--from-pod", "plain/outsider", "--to-pod", "open/echo", "--port", "8080", "--last", "0", "-o", "json"]);
    assert!(flows.lines().any(|l| l.contains("\"FORWARDED\"")), "the balanced connect() is a FORWARDED flow to the endpoint: {flows}");

    // Connect-time load balancing for a meshed pod: the kernel chooses the
    // endpoint, the node proxy gets both the service address (telemetry,
    // the forwarded header) and that choice, and honours it. Shown by
    // leaving one of multi's two endpoints in the kernel's map: every
    // connection then lands on that one (by the proxy's draw alone, ten in
    // a row would be a 1 in 1024 chance).
    let multi_vip =
        c.status()["services"].as_array().unwrap().iter().find(|s| s["name"] == "multi").unwrap()["vip"].as_str().unwrap().to_string();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>();
    let vip_b = multi_vip.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let mut svc_key = vip_b.to_vec();
    svc_key.extend(80u16.to_ne_bytes());
    svc_key.extend([6, 0]);
    let mut be_key = svc_key[..6].to_vec();
    be_key.extend(0u16.to_ne_bytes());
    let bpftool = |args: &[String]| -> String {
        let o = std::process::Command::new("bpftool").args(args).output().unwrap();
        assert!(o.status.success(), "bpftool {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let pinned = |m: &str| dir.join("maps").join(m).display().to_string();
    let mut lookup =
        vec!["-j".to_string(), "map".into(), "lookup".into(), "pinned".into(), pinned("ss_backends_v1"), "key".into(), "hex".into()];
    lookup.extend(hex(&be_key));
    let v: serde_json::Value = serde_json::from_str(&bpftool(&lookup)).unwrap();
    let ip: Vec<u8> = v["value"].as_array().unwrap()[..4]
        .iter()
        .map(|x| u8::from_str_radix(x.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
        .collect();
    let kept_ip = std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).to_string();
    let kept = c.pods("multi").iter().find(|p| p["ip"] == kept_ip.as_str()).unwrap_or_else(|| panic!("no multi pod has {kept_ip}"))["name"]
        .as_str()
        .unwrap()
        .to_string();
    let set_count = |n: u32| {
        let mut a = vec!["map".to_string(), "update".into(), "pinned".into(), pinned("ss_services_v1"), "key".into(), "hex".into()];
        a.extend(hex(&svc_key));
        a.extend(["value".to_string(), "hex".into()]);
        a.extend(hex(&[n.to_ne_bytes(), [0; 4]].concat()));
        bpftool(&a);
    };
    set_count(1);
    for i in 0..10 {
        let (code, out) = c.exec("production", "deploy/frontend", &["curl", "-sS", "--max-time", "3", "http://multi.open/headers"]);
        assert_eq!(code, 0, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(v["server"], kept.as_str(), "connection {i} went to the endpoint the kernel chose: {out}");
    }
    set_count(2);
    let m = node1.metrics();
    assert!(
        m.sum("istio_tcp_connections_opened_total", &["reporter=\"source\"", "destination_service_name=\"multi\""]) >= 10,
        "the proxy still knew the service the app dialed"
    );

    // A node proxy away: the kernel alone keeps refusing, at once.
    let pid = node1.pid;
    unsafe_kill(pid);
    let (code, out) = c.exec("production", "deploy/legacy-service", &["python3", "-c", CONNECT, &billing_ip, "8080", "3"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().all(|l| l.starts_with("EPERM ")), "refused while the proxy is away: {out}");
    wait_until("node1's proxy to be back", Duration::from_secs(30), || {
        c.status()["nodes"][0]["proxy"]["ready"] == true && c.status()["nodes"][0]["proxy"]["pid"].as_i64() != Some(pid as i64)
    });
    wait_until("frontend to reach billing again", Duration::from_secs(20), || {
        c.exec("production", "deploy/frontend", &["curl", "-sS", "--max-time", "3", &format!("http://{billing_ip}:8080/headers")]).0 == 0
    });

    c.down();
    assert!(!dir.exists(), "pins left after down");
}

fn unsafe_kill(pid: i32) {
    let o = std::process::Command::new("kill").args(["-9", &pid.to_string()]).output().unwrap();
    assert!(o.status.success(), "kill {pid}: {}", text(&o));
}

#[test]
fn nftables_when_asked_and_no_flows_to_observe() {
    let name = "t-ebpf-off";
    let c = Cluster::up(name, &["--datapath", "nftables"]);
    let st = c.status();
    assert_eq!(st["nodes"][0]["datapath"]["mode"], "nftables", "{st}");
    assert!(st["nodes"][0]["datapath"]["fallback"].is_null(), "asked for, not a fallback: {st}");
    assert!(!Path::new("/sys/fs/bpf/slipstream").join(name).exists(), "nothing is loaded with --datapath nftables");
    let client = &c.pods("client")[0];
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", client["netns"].as_str().unwrap(), "nft", "list", "ruleset"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("table inet slipstream_mesh"), "nftables capture in the pod");
    let (code, out) = c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "3", "http://echo.default:8080/headers"]);
    assert_eq!(code, 0, "{out}");
    let o = c.run(&["observe"]);
    assert!(!o.status.success(), "observe has nothing to read");
    assert!(text(&o).contains("nftables datapath, which records no flows"), "{}", text(&o));
    c.down();
}

/// A UDP echo server on :5353 (`echo ` + what came).
const UDP_ECHO: &str = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 5353))
while True:
    d, a = s.recvfrom(100)
    s.sendto(b"echo " + d, a)
"#;

/// One datagram to ADDR:5353 from an unconnected socket; prints the
/// answer, `timeout` (none within 2 s) or the errno name of sendto().
const UDP_ASK: &str = r#"
import errno, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.sendto(b"ping", (sys.argv[1], 5353))
    print(s.recvfrom(100)[0].decode())
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"#;

/// The same server, clients and NetworkPolicies in a meshed namespace and
/// in one outside the mesh; a pod kept on nftables as a source the socket
/// hooks do not see.
fn udp_manifest() -> String {
    let mut m = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: udpold, labels: {slipstream.io/datapath: nftables}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: outsider, namespace: udpold}\n\
         spec: {nodeName: node1, containers: [{name: c, command: [sleep, infinity]}]}\n",
    );
    for (ns, labels) in [("udpm", "{istio.io/dataplane-mode: ambient}"), ("udpp", "{}")] {
        m.push_str(&format!(
            r#"---
apiVersion: v1
kind: Namespace
metadata: {{name: {ns}, labels: {labels}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: {ns}, labels: {{app: server}}}}
spec: {{nodeName: node2, containers: [{{name: s, command: [python3, -c, {echo}], securityContext: {{runAsUser: 65532}}}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: friend, namespace: {ns}, labels: {{app: friend}}}}
spec: {{nodeName: node1, containers: [{{name: c, command: [sleep, infinity], securityContext: {{runAsUser: 65532}}}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: stranger, namespace: {ns}, labels: {{app: stranger}}}}
spec: {{nodeName: node1, containers: [{{name: c, command: [sleep, infinity], securityContext: {{runAsUser: 65532}}}}]}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: server, namespace: {ns}}}
spec:
  podSelector: {{matchLabels: {{app: server}}}}
  policyTypes: [Ingress, Egress]
  ingress: [{{from: [{{podSelector: {{matchLabels: {{app: friend}}}}}}], ports: [{{protocol: UDP, port: 5353}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: friend-closed, namespace: {ns}}}
spec:
  podSelector: {{matchLabels: {{app: friend}}}}
  policyTypes: [Ingress]
"#,
            echo = serde_json::to_string(UDP_ECHO).unwrap()
        ));
    }
    m
}

/// UDP is decided by the kernel at both ends for every pod on the
/// datapath, meshed or not (docs/datapath.md, "UDP, ICMP and the rest"):
/// a client isolated for ingress gets its answers and a server isolated
/// for egress gives them (the flow table); a stranger is refused at its
/// own sendto() with EPERM; a source the socket hooks do not see (a pod
/// kept on nftables) is dropped at the server's tc ingress, counted on the
/// server's node; and the node proxy's nftables table holds no chain for
/// these pods: the kernel alone enforces it.
#[test]
fn udp_policy_holds_in_the_kernel_at_both_ends_with_answers_let_through() {
    let name = "t-ebpf-udp";
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(&tmp, "udp.yaml", &udp_manifest());
    let c = Cluster::up(name, &["--datapath", "ebpf", "-f", &m]);
    let st = c.status();
    let ip = |ns: &str, pod: &str| -> String {
        st["pods"].as_array().unwrap().iter().find(|p| p["namespace"] == ns && p["name"] == pod).unwrap()["ip"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let ask = |ns: &str, pod: &str, to: &str| -> String {
        let (code, out) = c.exec(ns, pod, &["python3", "-c", UDP_ASK, to]);
        assert_eq!(code, 0, "{ns}/{pod}: {out}");
        out.trim().to_string()
    };
    let node2 = Proxy::of(&c, "node2");
    let node1 = Proxy::of(&c, "node1");
    let denied = |p: &Proxy| p.metrics().sum("slipstream_datapath_drops_total", &["reason=\"POLICY_DENIED\""]);
    for ns in ["udpm", "udpp"] {
        let server = ip(ns, "server");
        wait_until(format!("{ns}/friend gets the echo of {server}"), Duration::from_secs(15), || ask(ns, "friend", &server) == "echo ping");
        let (before1, before2) = (denied(&node1), denied(&node2));
        assert_eq!(ask(ns, "stranger", &server), "EPERM", "{ns}: refused at the stranger's own sendto()");
        assert_eq!(denied(&node1), before1 + 1, "{ns}: counted where it was refused");
        assert_eq!(ask("udpold", "outsider", &server), "timeout", "{ns}: a source the hooks do not see");
        assert_eq!(denied(&node2), before2 + 1, "{ns}: dropped and counted at the server's tc ingress");
        assert_eq!(ask(ns, "friend", &server), "echo ping", "{ns}: the friend still gets its answers");
    }
    // observe shows them as hubble would, with the protocol and the policy.
    let drops = c.ok(&["observe", "--protocol", "udp", "--type", "drop", "--last", "0"]);
    let outsider_drops: Vec<&str> = drops.lines().filter(|l| l.contains("udpold/outsider")).collect();
    assert_eq!(outsider_drops.len(), 2, "{drops}");
    for l in &outsider_drops {
        assert!(l.contains("DROPPED POLICY_DENIED at tc-ingress (UDP)") && l.contains("NetworkPolicy"), "{drops}");
    }
    assert_eq!(drops.lines().filter(|l| l.contains("/stranger") && l.contains("at connect (UDP)")).count(), 2, "{drops}");
    let flows = c.ok(&["observe", "--protocol", "udp", "--verdict", "forwarded", "--last", "0"]);
    assert!(flows.lines().any(|l| l.contains("udpm/friend") && l.contains("FORWARDED")), "a new UDP flow is recorded: {flows}");
    // The kernel alone holds these pods' policies: no chain in the node's
    // nftables table for them (the nftables path would have one for each
    // pod outside the mesh).
    let netns2 = st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap()["netns"].as_str().unwrap().to_string();
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", &netns2, "nft", "list", "table", "inet", "slipstream_netpol"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "the node proxy keeps its nftables table (for pods kept on nftables): {}", text(&o));
    assert!(table.contains("chain forward"), "{table}");
    assert!(!table.contains(&ip("udpp", "server")), "the nftables table still decides for a pod on the datapath:\n{table}");
    c.down();
}
