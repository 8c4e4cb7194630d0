//! Issue 11, findings 1-3: no pod can kill, starve or exhaust its node
//! proxy. Each case acts as an attacker would, from inside a pod as an
//! unprivileged user (uid 1000 via setpriv), and checks what a user would:
//! the attacker is refused fast and with a flag in the metrics and the
//! access log, the proxy keeps its pid and bounded descriptors and memory,
//! and everyone else is served meanwhile.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a command in a pod as uid/gid 1000 without supplementary groups or
/// capabilities, whatever the pod's securityContext says: `exec
/// --privileged` (root), then setpriv drops to the unprivileged user.
const AS_USER: [&str; 6] = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"];

const CLOSED: &str = "istio_tcp_connections_closed_total";
const REJECTED: &str = "slipstream_rejected_connections_total";

/// `slipstream up -f examples/quickstart` with `env` set for the node
/// proxies (the agent passes SLIPSTREAM_NODE_* through).
fn up(name: &str, env: &[(&str, &str)]) -> Cluster {
    require_root();
    let _ = run(name, &["down"]);
    let qs = repo().join("examples/quickstart").display().to_string();
    let o = Command::new(bin()).envs(env.iter().copied()).args(["--cluster", name, "up", "-f", &qs]).output().unwrap();
    let c = Cluster::adopt(name);
    assert!(o.status.success(), "up failed:\n{}", text(&o));
    c
}

fn pod_ip(c: &Cluster, prefix: &str) -> String {
    c.pods(prefix)[0]["ip"].as_str().unwrap().to_string()
}

/// `slipstream exec deploy/<deploy> -- setpriv ... python3 -c SCRIPT ARGS`,
/// with pipes for stdin and stdout.
fn python_in(c: &Cluster, deploy: &str, script: &str, args: &[&str]) -> std::process::Child {
    let target = format!("deploy/{deploy}");
    Command::new(bin())
        .args(["--cluster", &c.name, "exec", "--privileged", &target, "--"])
        .args(AS_USER)
        .args(["python3", "-c", script])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Runs a script to its end; its last stdout line as JSON.
fn python(c: &Cluster, deploy: &str, script: &str, args: &[&str]) -> Value {
    let mut child = python_in(c, deploy, script, args);
    drop(child.stdin.take());
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "python in {deploy} failed: {out}");
    out.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| panic!("no JSON from the script: {out}"))
}

/// The refusal log lines of `source` since `offset`: access-log lines with
/// `flag` (matching `must`), plus what the summaries say was suppressed.
fn logged_refusals(p: &Proxy, offset: usize, flag: &str, must: &str) -> (usize, u64) {
    let log = p.log_since(offset);
    let lines =
        log.lines().filter(|l| l.starts_with("connection complete") && l.contains(&format!("flag={flag}")) && l.contains(must)).count();
    let suppressed = log
        .lines()
        .filter(|l| l.contains("more refusals of this source not logged") && l.contains(must))
        .filter_map(|l| l.split("suppressed=").nth(1)?.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    (lines, suppressed)
}

/// Connects to each target and tries to read: how each attempt ended and
/// how long it took. `[a]:p` targets use an IPv6 socket.
const SELF_CALLS_PY: &str = r#"
import json, socket, sys, time
out = []
for t in sys.argv[1:]:
    host, port = t.rsplit(":", 1)
    fam = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    t0 = time.monotonic()
    try:
        s.connect((host.strip("[]"), int(port)))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        end = "eof"
        while True:
            d = s.recv(4096)
            if not d:
                break
            end = "data-eof"
    except ConnectionRefusedError:
        end = "refused"
    except (ConnectionResetError, BrokenPipeError):
        end = "reset"
    except socket.timeout:
        end = "timeout"
    s.close()
    out.append({"target": t, "end": end, "ms": int((time.monotonic() - t0) * 1000)})
print(json.dumps(out))
"#;

#[test]
fn a_pod_cannot_make_its_node_proxy_call_itself() {
    let c = up("t-hp-self", &[]);
    let node1 = Proxy::of(&c, "node1");
    let ip = pod_ip(&c, "client-");
    // The mesh works, and its pooled tunnel is open before measuring.
    let (code, out) =
        c.exec("default", "deploy/client", &["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://echo:8080/echo"]);
    assert_eq!((code, out.as_str()), (0, "200"));
    let (fds, rss, log) = (node1.fds(), node1.rss_kib(), node1.log_len());
    let m = node1.metrics();

    // Every way back into the proxy a pod might try, then the same one many
    // times (the log must not repeat it endlessly).
    let mut targets: Vec<String> = [
        "127.0.0.1:15001",
        "127.0.0.2:15001",
        "0.0.0.0:15001",
        "[::ffff:127.0.0.1]:15001",
        "127.0.0.1:15006",
        "127.0.0.1:15020",
        "127.0.0.1:15021",
        "127.0.0.1:15000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for port in [15001, 15006, 15008, 15020, 15021, 15000] {
        targets.push(format!("{ip}:{port}"));
    }
    targets.extend(std::iter::repeat_n("127.0.0.1:15001".to_string(), 30));
    let args: Vec<&str> = targets.iter().map(String::as_str).collect();
    let v = python(&c, "client", SELF_CALLS_PY, &args);
    let results = v.as_array().unwrap();
    assert_eq!(results.len(), targets.len());
    // Exactly these reach the proxy's listeners in the pod (127.0.0.1:15001,
    // 0.0.0.0:15006, <pod IP>:15008) and are self-calls: reset by the
    // proxy. The admin ports listen in the node's namespace, not the pod's,
    // and 15001 only on 127.0.0.1: those targets find nothing listening and
    // the pod's own kernel refuses them, the proxy never sees them.
    let self_outbound = ["127.0.0.1:15001", "0.0.0.0:15001", "[::ffff:127.0.0.1]:15001"];
    let self_inbound = ["127.0.0.1:15006".to_string(), format!("{ip}:15006")];
    let mut kernel: Vec<String> = ["127.0.0.2:15001", "127.0.0.1:15020", "127.0.0.1:15021", "127.0.0.1:15000"].map(String::from).to_vec();
    kernel.extend([15001, 15020, 15021, 15000].map(|p| format!("{ip}:{p}")));
    let hbone = format!("{ip}:15008");
    for r in results {
        let (t, end, ms) = (r["target"].as_str().unwrap(), r["end"].as_str().unwrap(), r["ms"].as_u64().unwrap());
        assert!(ms < 2000, "{t}: failed fast, not after {ms} ms ({end})");
        let want = if self_outbound.contains(&t) || self_inbound.iter().any(|s| s == t) {
            "reset"
        } else if kernel.iter().any(|k| k == t) {
            "refused"
        } else {
            assert_eq!(t, hbone, "a target of the list");
            // The HBONE server, which refuses plaintext (not a self-call).
            assert!(end != "refused" && end != "timeout", "{t}: {r}");
            continue;
        };
        assert_eq!(end, want, "{t}: {r}");
    }
    // 30 more to 127.0.0.1:15001, then the three outbound and two inbound.
    let (outbound, inbound) = (30 + self_outbound.len() as u64, self_inbound.len() as u64);
    let refused = outbound + inbound;

    // Counted exactly, each with its flag and side.
    let self_calls = |m: &Metrics, reporter: &str| m.sum(CLOSED, &[&format!("reporter=\"{reporter}\""), "response_flags=\"SELF_CALL\""]);
    wait_until("every self-call counted", Duration::from_secs(10), || {
        let now = node1.metrics();
        self_calls(&now, "source") + self_calls(&now, "destination") - self_calls(&m, "source") - self_calls(&m, "destination") == refused
    });
    let m2 = node1.metrics();
    assert_eq!(self_calls(&m2, "source") - self_calls(&m, "source"), outbound, "the captured ones, on :15001");
    assert_eq!(self_calls(&m2, "destination") - self_calls(&m, "destination"), inbound, "the two to :15006");
    let not_tls = |m: &Metrics| m.sum(REJECTED, &["reason=\"not_tls\""]);
    assert_eq!(not_tls(&m2) - not_tls(&m), 1, "the plaintext request to {hbone}, refused by the HBONE server");
    // Logged: a few lines per second, the rest summarised, none lost.
    wait_until("the self-calls logged or summarised", Duration::from_secs(10), || {
        let (lines, suppressed) = logged_refusals(&node1, log, "SELF_CALL", "");
        lines as u64 + suppressed == refused
    });
    let (lines, suppressed) = logged_refusals(&node1, log, "SELF_CALL", "");
    eprintln!("{refused} self-calls refused: {lines} access-log lines, {suppressed} summarised");
    assert!(suppressed > 0 && lines < 20, "rate-limited: {lines} lines, {suppressed} suppressed");
    let new_log = node1.log_since(log);
    // Refused before any dial: no tunnel, so dst.addr is the address the
    // pod dialled and there is no dst.hbone_addr.
    let l = new_log.lines().find(|l| l.contains("flag=SELF_CALL") && l.contains("dst.addr=127.0.0.1:15001")).unwrap();
    assert!(l.contains("error=\"self-call refused: 127.0.0.1:15001 is one of the node proxy's own ports"), "{l}");
    assert!(!l.contains("dst.hbone_addr="), "{l}");
    assert!(new_log.contains("WARN") && new_log.contains("connection refused: self-call refused"), "{new_log}");

    // The proxy is the same process, with the descriptors and memory it had.
    node1.assert_same(&c, "self-calls");
    node1.settle_fds("self-calls", fds + 2);
    let grew = node1.rss_kib().saturating_sub(rss);
    assert!(grew < 20 * 1024, "the node proxy grew by {grew} KiB");
    // And the client still reaches echo through the mesh.
    let (code, out) =
        c.exec("default", "deploy/client", &["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://echo:8080/echo"]);
    assert_eq!((code, out.as_str()), (0, "200"));
    c.down();
}

/// Opens `n` connections to `host:port` as fast as it can, each sending one
/// byte; reports how many were echoed (served) and how many reset or
/// closed (refused); then, until stdin has a line, keeps opening new ones
/// (all refused while it holds its limit) and finally closes everything.
const FLOOD_PY: &str = r#"
import json, select, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ip = socket.gethostbyname(host)
def attempt():
    s = socket.socket()
    try:
        s.connect((ip, port))
        s.sendall(b"x")
        return s
    except OSError:
        s.close()
        return None
socks = [attempt() for _ in range(n)]
served, refused, timeout, held = 0, 0, 0, []
for s in socks:
    if s is None:
        refused += 1
        continue
    s.settimeout(10)
    try:
        if s.recv(1) == b"x":
            served += 1
            held.append(s)
            continue
        refused += 1
    except socket.timeout:
        timeout += 1
    except OSError:
        refused += 1
    s.close()
print(json.dumps({"served": served, "refused": refused, "timeout": timeout}), flush=True)
more = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    s = attempt()
    more += 1
    if s is not None:
        s.settimeout(5)
        try:
            d = s.recv(1)
            if d:
                served += 1
                held.append(s)
                continue
        except OSError:
            pass
        s.close()
    refused += 1
    # Not synchronization: the pace of the attack (about 1000 a second).
    time.sleep(0.001)
for s in held:
    s.close()
print(json.dumps({"served": served, "refused": refused, "more": more}), flush=True)
"#;

const FLOODER: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: flooder}
spec:
  replicas: 1
  selector: {matchLabels: {app: flooder}}
  template:
    metadata: {labels: {app: flooder}}
    spec:
      serviceAccountName: client
      nodeName: node1
      containers:
      - name: flooder
        command: [sleep, infinity]
"#;

#[test]
fn one_pod_at_its_limit_does_not_starve_the_others() {
    const LIMIT: u64 = 200;
    let c = up("t-hp-fair", &[("SLIPSTREAM_NODE_POD_CONNECTIONS", "200")]);
    let dir = tempfile::tempdir().unwrap();
    c.ok(&["apply", "-f", &write_manifest(&dir, "flooder.yaml", FLOODER)]);
    wait_until("the flooder running", Duration::from_secs(30), || c.pods("flooder-").first().is_some_and(|p| p["ready"] == true));
    let node1 = Proxy::of(&c, "node1");
    let dump = {
        let o = Command::new("ip")
            .args(["netns", "exec", &node1.netns, "curl", "-sS", "--max-time", "5", "http://127.0.0.1:15000/config_dump"])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&o.stdout).unwrap_or_else(|_| panic!("config_dump: {}", text(&o)))
    };
    assert_eq!(dump["config"]["limits"]["pod_connections"], LIMIT, "the limit is in /config_dump: {}", dump["config"]["limits"]);
    let (log, m) = (node1.log_len(), node1.metrics());
    let flooder_flag = ["source_workload=\"flooder\"", "response_flags=\"SOURCE_LIMIT\""];

    // The flooder (unprivileged) opens 1000 connections and holds them.
    let mut flood = python_in(&c, "flooder", FLOOD_PY, &["echo", "9000", "1000"]);
    let mut lines = BufReader::new(flood.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().expect("the flooder's first line").unwrap()).unwrap();
    assert_eq!(first, serde_json::json!({"served": LIMIT, "refused": 1000 - LIMIT, "timeout": 0}), "exactly its limit served");

    // Meanwhile the other pod of the node is served as before.
    let o = c.run(&[
        "exec",
        "deploy/client",
        "--",
        "fortio",
        "load",
        "-c",
        "4",
        "-qps",
        "100",
        "-t",
        "5s",
        "-json",
        "-",
        "http://echo:8080/echo?size=64",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "fortio: {}", text(&o));
    let f: Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
    let count = f["DurationHistogram"]["Count"].as_u64().unwrap();
    assert!(count >= 400, "the steady client made {count} requests in 5 s at 100 qps");
    assert_eq!(f["RetCodes"], serde_json::json!({"200": count}), "every request answered 200 while the flood held: {}", f["RetCodes"]);
    let p99 = f["DurationHistogram"]["Percentiles"].as_array().unwrap().iter().find(|p| p["Percentile"] == 99.0).unwrap()["Value"]
        .as_f64()
        .unwrap();
    eprintln!("while the flood held: the steady client made {count} requests, all 200, p99 {:.1} ms", p99 * 1000.0);
    assert!(p99 < 0.5, "p99 latency {p99} s while the flood held");

    // The flooder lets go; everything it was refused is counted exactly.
    let mut stdin = flood.stdin.take().unwrap();
    writeln!(stdin, "release").unwrap();
    drop(stdin);
    let last: Value = serde_json::from_str(&lines.next().expect("the flooder's last line").unwrap()).unwrap();
    assert!(flood.wait().unwrap().success());
    assert_eq!(last["served"], LIMIT, "nothing more served while it held its limit: {last}");
    let refused = last["refused"].as_u64().unwrap();
    assert!(refused > 1000 - LIMIT, "{last}");
    wait_until("every refusal counted", Duration::from_secs(10), || {
        node1.metrics().sum(CLOSED, &flooder_flag) - m.sum(CLOSED, &flooder_flag) == refused
    });
    // In the access log: a few lines a second, the rest summarised.
    wait_until("every refusal logged or summarised", Duration::from_secs(10), || {
        let (lines, suppressed) = logged_refusals(&node1, log, "SOURCE_LIMIT", "flooder");
        lines as u64 + suppressed == refused
    });
    let (logged, suppressed) = logged_refusals(&node1, log, "SOURCE_LIMIT", "flooder");
    eprintln!("the flooder was refused {refused} times: {logged} access-log lines, {suppressed} summarised");
    assert!(logged > 0 && (logged as u64) < refused / 4, "{logged} lines for {refused} refusals");
    assert!(node1.log_since(log).contains("source limit: already 200 open outbound connections"), "the line says why");
    // Nobody else was refused.
    let others = node1.metrics().sum(CLOSED, &["source_workload=\"client\"", "response_flags=\"SOURCE_LIMIT\""]);
    assert_eq!(others, 0);

    // Released: the flooder is served again.
    wait_until("the flooder served again", Duration::from_secs(15), || {
        python(&c, "flooder", FLOOD_PY, &["echo", "9000", "20"])["served"] == 20
    });
    node1.assert_same(&c, "flood");
    c.down();
}

/// Opens `n` connections to each `host:port`, sends a request line and
/// nothing more, then waits until the server closed each (or `wait` s).
/// Reports how many were closed, still open, and the longest a connection
/// stayed open.
const SLOW_PY: &str = r#"
import json, resource, selectors, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n, wait, send = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].encode()
sel = selectors.DefaultSelector()
opened, closed, longest = 0, 0, 0.0
for target in sys.argv[4:]:
    host, port = target.rsplit(":", 1)
    for _ in range(n):
        s = socket.socket()
        t0 = time.monotonic()
        try:
            s.connect((host, int(port)))
            if send:
                s.sendall(send)
        except OSError:
            s.close()
            opened += 1
            closed += 1
            continue
        opened += 1
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, t0)
print(json.dumps({"opened": opened}), flush=True)
deadline = time.monotonic() + wait
while sel.get_map() and time.monotonic() < deadline:
    for key, _ in sel.select(timeout=0.2):
        try:
            d = key.fileobj.recv(4096)
        except OSError:
            d = b""
        if not d:
            longest = max(longest, time.monotonic() - key.data)
            sel.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
still = len(sel.get_map())
print(json.dumps({"opened": opened, "closed": closed, "still_open": still, "longest_s": round(longest, 2)}), flush=True)
"#;

const OUTSIDER: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: outsider}
spec:
  replicas: 1
  selector: {matchLabels: {app: outsider}}
  template:
    metadata: {labels: {app: outsider, istio.io/dataplane-mode: none}}
    spec:
      serviceAccountName: client
      nodeName: node1
      containers:
      - name: outsider
        command: [sleep, infinity]
"#;

#[test]
fn slow_clients_cannot_hold_the_proxy_ports() {
    let c = up("t-hp-slow", &[("SLIPSTREAM_NODE_ADMIN_HEADER_TIMEOUT", "2s"), ("SLIPSTREAM_NODE_PEER_HANDSHAKES", "10")]);
    let dir = tempfile::tempdir().unwrap();
    c.ok(&["apply", "-f", &write_manifest(&dir, "outsider.yaml", OUTSIDER)]);
    wait_until("the outsider running", Duration::from_secs(30), || c.pods("outsider-").first().is_some_and(|p| p["ready"] == true));
    assert_eq!(c.pods("outsider-")[0]["meshed"], false);
    let node2 = Proxy::of(&c, "node2");
    let node2_ip =
        c.status()["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap()["ip"].as_str().unwrap().to_string();
    let (fds, m) = (node2.fds(), node2.metrics());

    // 3000 half-sent requests to :15020 and :15021 of node2, from an
    // unmeshed pod on node1.
    let (stats, ready) = (format!("{node2_ip}:15020"), format!("{node2_ip}:15021"));
    let mut slow = python_in(&c, "outsider", SLOW_PY, &["1500", "20", "GET /metrics HTTP/1.1\r\n", &stats, &ready]);
    let mut lines = BufReader::new(slow.stdout.take().unwrap()).lines();
    let opened: Value = serde_json::from_str(&lines.next().expect("the attacker's first line").unwrap()).unwrap();
    assert_eq!(opened["opened"], 3000);
    // During the attack: a fresh scrape answers, and the proxy holds few
    // descriptors for it (caps per listener and source).
    let t0 = Instant::now();
    let scrape = node2.metrics();
    assert!(scrape.0.contains("# TYPE istio_tcp_connections_opened counter"), "a fresh scrape answers");
    assert!(t0.elapsed() < Duration::from_secs(2), "and fast: {:?}", t0.elapsed());
    let during = node2.fds();
    assert!(during <= fds + 2 * 16 + 8, "the attack holds {} descriptors of the proxy", during - fds);
    let done: Value = serde_json::from_str(&lines.next().expect("the attacker's last line").unwrap()).unwrap();
    assert!(slow.wait().unwrap().success());
    assert_eq!(
        (done["closed"].as_u64(), done["still_open"].as_u64()),
        (Some(3000), Some(0)),
        "every connection closed by the proxy: {done}"
    );
    assert!(done["longest_s"].as_f64().unwrap() < 6.0, "none outlived the 2 s header timeout by much: {done}");
    // Each one counted: refused at once over the cap, or timed out.
    let mm = node2.metrics();
    let delta = |reason: &str| mm.sum(REJECTED, &[&format!("reason=\"{reason}\"")]) - m.sum(REJECTED, &[&format!("reason=\"{reason}\"")]);
    let (capped, timed_out) = (delta("admin_source_limit"), delta("admin_header_timeout"));
    eprintln!("3000 half-sent requests: {capped} refused at the cap, {timed_out} closed by the header timeout; {done}");
    assert_eq!(capped + timed_out, 3000, "capped {capped}, timed out {timed_out}");
    assert!(timed_out >= 32 && capped > 2000, "capped {capped}, timed out {timed_out}");
    node2.settle_fds("slow admin clients", fds + 2);

    // Silent TCP to a pod's HBONE port: handshakes pending per peer IP are
    // capped (10 here); the rest are closed at once.
    let m = node2.metrics();
    let hbone = format!("{}:15008", pod_ip(&c, "echo-"));
    let v = python(&c, "outsider", SLOW_PY, &["30", "1", "", &hbone]);
    assert_eq!((v["closed"].as_u64(), v["still_open"].as_u64()), (Some(20), Some(10)), "10 handshakes pending, 20 refused: {v}");
    let refused = node2.metrics().sum(REJECTED, &["response_flags=\"SOURCE_LIMIT\"", "reason=\"peer_handshake_limit\""])
        - m.sum(REJECTED, &["response_flags=\"SOURCE_LIMIT\"", "reason=\"peer_handshake_limit\""]);
    assert_eq!(refused, 20);
    node2.settle_fds("silent HBONE clients", fds + 2);
    node2.assert_same(&c, "slow clients");
    // The mesh still serves.
    let (code, out) =
        c.exec("default", "deploy/client", &["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://echo:8080/echo"]);
    assert_eq!((code, out.as_str()), (0, "200"));
    c.down();
}

/// The admin caps must never cost the node proxy its life: the agent probes
/// readiness on 127.0.0.1:15021 in the node's namespace, where no pod can
/// come from. Here pods on both nodes fill node2's readiness listener (caps
/// 4 in total, 2 per source, a header timeout longer than the attack) for
/// longer than the agent's three failed probes would take (2 s apart, 1 s
/// timeout each): the proxy keeps its pid and stays ready.
#[test]
fn pods_filling_the_admin_caps_cannot_get_the_proxy_restarted() {
    let c = up(
        "t-hp-probe",
        &[
            ("SLIPSTREAM_NODE_ADMIN_CONNECTIONS", "4"),
            ("SLIPSTREAM_NODE_ADMIN_CONNECTIONS_PER_SOURCE", "2"),
            ("SLIPSTREAM_NODE_ADMIN_HEADER_TIMEOUT", "40s"),
            ("SLIPSTREAM_NODE_ADMIN_CONNECTION_DEADLINE", "60s"),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    c.ok(&["apply", "-f", &write_manifest(&dir, "outsider.yaml", OUTSIDER)]);
    wait_until("the outsider running", Duration::from_secs(30), || c.pods("outsider-").first().is_some_and(|p| p["ready"] == true));
    let node2 = Proxy::of(&c, "node2");
    let proxy_of = |st: &Value| st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap()["proxy"].clone();
    wait_until("node2's proxy ready", Duration::from_secs(30), || proxy_of(&c.status())["ready"] == true);
    let node2_ip =
        c.status()["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap()["ip"].as_str().unwrap().to_string();
    let ready = format!("{node2_ip}:15021");
    let m = node2.metrics();
    let delta = |now: &Metrics, flag: &str, reason: &str| {
        let l = [format!("response_flags=\"{flag}\""), format!("reason=\"{reason}\"")];
        let l: Vec<&str> = l.iter().map(String::as_str).collect();
        now.sum(REJECTED, &l) - m.sum(REJECTED, &l)
    };

    // An unmeshed pod on node1 and the echo pod on node2 (local to the
    // proxy) each try 4 half-sent requests and hold what is admitted for
    // 20 s: 2 each, which fills the listener's 4.
    let hold = ["4", "20", "GET /healthz/ready HTTP/1.1\r\n", ready.as_str()];
    let mut holders: Vec<_> = ["outsider", "echo"].iter().map(|d| python_in(&c, d, SLOW_PY, &hold)).collect();
    let mut lines: Vec<_> = holders.iter_mut().map(|h| BufReader::new(h.stdout.take().unwrap()).lines()).collect();
    for l in &mut lines {
        let opened: Value = serde_json::from_str(&l.next().expect("a holder's first line").unwrap()).unwrap();
        assert_eq!(opened["opened"], 4);
    }
    wait_until("each holder refused twice at its own cap", Duration::from_secs(10), || {
        delta(&node2.metrics(), "SOURCE_LIMIT", "admin_source_limit") == 4
    });
    let full_since = Instant::now();
    // A third source (the client pod on node1) finds the listener full.
    let v = python(&c, "client", SLOW_PY, &["2", "1", "GET /healthz/ready HTTP/1.1\r\n", &ready]);
    assert_eq!((v["closed"].as_u64(), v["still_open"].as_u64()), (Some(2), Some(0)), "refused at once: {v}");
    assert_eq!(delta(&node2.metrics(), "OVERLOAD", "admin_limit"), 2, "the listener's cap was hit");

    // While it stays full, longer than three probe failures would take,
    // every status says the same process, ready, never restarted.
    let mut polls = 0;
    while full_since.elapsed() < Duration::from_secs(12) {
        let p = proxy_of(&c.status());
        assert_eq!(p["pid"].as_i64(), Some(node2.pid as i64), "the agent replaced node2's proxy after {:?}: {p}", full_since.elapsed());
        assert_eq!((p["ready"].as_bool(), p["restarts"].as_u64()), (Some(true), Some(0)), "after {:?}: {p}", full_since.elapsed());
        polls += 1;
        // Not synchronization: the proxy must NOT be replaced during these
        // 12 s; this is how often that is checked.
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(polls >= 10, "{polls} status polls in 12 s");
    // The holders kept their connections all along (the cap stayed full).
    for (mut h, mut l) in holders.into_iter().zip(lines) {
        let done: Value = serde_json::from_str(&l.next().expect("a holder's last line").unwrap()).unwrap();
        assert!(h.wait().unwrap().success());
        assert_eq!((done["closed"].as_u64(), done["still_open"].as_u64()), (Some(2), Some(2)), "2 refused, 2 held for 20 s: {done}");
    }
    node2.assert_same(&c, "full admin caps");
    let log = std::fs::read_to_string(&node2.log).unwrap();
    assert!(log.contains("connection to an admin port refused: too many open connections"), "the refusals are logged");
    c.down();
}
