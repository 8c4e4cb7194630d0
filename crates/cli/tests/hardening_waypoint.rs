//! Issue 36: a hostile pod or tenant against the waypoint and its
//! policies. Each case attacks from inside a pod (as an unprivileged user
//! unless it says otherwise) or as a tenant who may apply objects into its
//! own namespace, in a real local cluster, and checks what holds: the
//! refusal, where it shows, and that everyone else is served.

mod common;
use common::*;
use std::time::Duration;

/// Runs a command in a pod as uid/gid 1000 without supplementary groups or
/// capabilities, whatever the pod's securityContext says.
const AS_USER: [&str; 6] = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"];

/// A namespace whose services and pods are bound to its waypoint (for
/// both), an echo server `web` on node2 (HTTP on 8080, TCP echo on 9000),
/// and two clients on node1.
const SHOP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, labels: {istio.io/waypoint-for: all}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: intruder, namespace: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      serviceAccountName: web
      nodeName: node2
      containers:
      - name: web
        command: [slipstream, app, echo]
        securityContext: {runAsUser: 65532, runAsGroup: 65532}
        ports: [{name: http, containerPort: 8080}, {name: tcp-echo, containerPort: 9000}]
        readinessProbe: {httpGet: {path: /healthz, port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 8080, targetPort: 8080}, {name: tcp-echo, port: 9000, targetPort: 9000}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: client, namespace: shop}
spec:
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      serviceAccountName: client
      nodeName: node1
      containers: [{name: c, command: [sleep, infinity], securityContext: {runAsUser: 65532, runAsGroup: 65532}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: intruder, namespace: shop}
spec:
  selector: {matchLabels: {app: intruder}}
  template:
    metadata: {labels: {app: intruder}}
    spec:
      serviceAccountName: intruder
      nodeName: node1
      containers: [{name: c, command: [sleep, infinity], securityContext: {runAsUser: 65532, runAsGroup: 65532}}]
"#;

fn shop(name: &str) -> (Cluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let world = write_manifest(&dir, "shop.yaml", SHOP);
    let c = Cluster::up(name, &["-f", &world]);
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    (c, dir)
}

/// Issue 36, item 1: a tenant's pod template that passes for the
/// waypoint's gets nothing of it. The reserved labels are refused at
/// apply, naming the field; a pod that runs as the waypoint's account
/// without them has no credential, no route to the control plane and is
/// no replica of the waypoint.
#[test]
fn a_pod_template_that_passes_for_the_waypoint_gets_none_of_its_credentials() {
    let (c, dir) = shop("t-hard-wp-id");
    let forged = write_manifest(
        &dir,
        "forged.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: lookalike, namespace: shop}\nspec:\n  selector: {matchLabels: {app: lookalike}}\n  template:\n    metadata:\n      labels: {app: lookalike, gateway.istio.io/managed: istio.io-mesh-controller, gateway.networking.k8s.io/gateway-name: waypoint}\n    spec:\n      serviceAccountName: waypoint\n      containers: [{name: c, command: [sleep, infinity]}]\n",
    );
    let o = c.run(&["apply", "-f", &forged]);
    let out = text(&o);
    assert!(!o.status.success(), "a pod template with the waypoint's labels was accepted:\n{out}");
    for field in
        ["spec.template.metadata.labels[gateway.istio.io/managed]", "spec.template.metadata.labels[gateway.networking.k8s.io/gateway-name]"]
    {
        assert!(out.contains(&format!("Deployment shop/lookalike: {field}")), "{field} not named:\n{out}");
    }
    assert!(c.pods("lookalike-").is_empty(), "the refused apply changed nothing");
    // A bare pod with the label, and `label` putting it on one later.
    let bare = write_manifest(
        &dir,
        "bare.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bare, namespace: shop, labels: {gateway.networking.k8s.io/gateway-name: waypoint}}\nspec:\n  serviceAccountName: waypoint\n  containers: [{name: c, command: [sleep, infinity]}]\n",
    );
    let out = text(&c.run(&["apply", "-f", &bare]));
    assert!(out.contains("Pod shop/bare: metadata.labels[gateway.networking.k8s.io/gateway-name]"), "{out}");
    let plain = bare.replace("bare.yaml", "plain.yaml");
    std::fs::write(
        &plain,
        std::fs::read_to_string(&bare).unwrap().replace(", labels: {gateway.networking.k8s.io/gateway-name: waypoint}", ""),
    )
    .unwrap();
    c.ok(&["apply", "-f", &plain]);
    let o = c.run(&["label", "pod", "bare", "-n", "shop", "gateway.networking.k8s.io/gateway-name=waypoint"]);
    assert!(!o.status.success() && text(&o).contains("metadata.labels[gateway.networking.k8s.io/gateway-name]"), "{}", text(&o));
    // The pod runs as the waypoint's account and is given nothing: no
    // token in its environment, no route to the control plane.
    wait_until("the bare pod running", Duration::from_secs(30), || c.pods("bare").first().is_some_and(|p| p["phase"] == "Running"));
    let mut probe = vec!["exec", "--privileged", "-n", "shop", "bare", "--"];
    probe.extend(AS_USER);
    probe.extend(["sh", "-c", "env | grep -c SLIPSTREAM_WAYPOINT; curl -sS --max-time 3 -o /dev/null http://172.18.255.1:15012/ && echo reached || echo unreachable"]);
    let out = String::from_utf8_lossy(&c.run(&probe).stdout).into_owned();
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["0", "unreachable"], "{out}");
    // It is no replica of the waypoint: the waypoint's Service has its own pod only.
    let status = c.status();
    let svc = status["services"].as_array().unwrap().iter().find(|s| s["namespace"] == "shop" && s["name"] == "waypoint").unwrap();
    let pods: Vec<&str> = svc["endpoints"].as_array().unwrap().iter().map(|e| e["pod"].as_str().unwrap()).collect();
    assert!(pods.len() == 1 && pods[0].starts_with("waypoint-"), "the waypoint's Service: {svc}");
    c.down();
}

/// The HTTP status of `curl URL` from `deploy/client`, as uid 1000.
fn status_of(c: &Cluster, from: &str, url: &str, extra: &[&str]) -> String {
    let target = format!("deploy/{from}");
    let mut a = vec!["exec", "--privileged", "-n", "shop", &target, "--"];
    a.extend(AS_USER);
    a.extend(["curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"]);
    a.extend(extra);
    a.push(url);
    let o = c.run(&a);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Issue 36, item 2: a request addressed to a pod's own address passes
/// the same policies at the waypoint as one addressed to its Service: the
/// Gateway's, the Service's (stricter than Istio, which applies those to
/// service-addressed requests only) and the pod's own.
#[test]
fn a_pod_addressed_directly_meets_the_same_policies_at_the_waypoint() {
    let (c, dir) = shop("t-hard-wp-addr");
    let web = c.pods("web-")[0]["ip"].as_str().unwrap().to_string();
    let by_pod = |path: &str| status_of(&c, "client", &format!("http://{web}:8080{path}"), &[]);
    let by_service = |path: &str| status_of(&c, "client", &format!("http://web.shop:8080{path}"), &[]);
    assert_eq!((by_pod("/headers"), by_service("/headers")), ("200".into(), "200".into()));
    let policies = write_manifest(
        &dir,
        "policies.yaml",
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-gateway-admin, namespace: shop}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules: [{to: [{operation: {paths: [/gateway-admin]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-service-admin, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: web}]
  action: DENY
  rules: [{to: [{operation: {paths: [/service-admin]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-no-pod-admin, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {paths: [/pod-admin]}}]}]
"#,
    );
    c.ok(&["apply", "-f", &policies]);
    for path in ["/gateway-admin", "/service-admin", "/pod-admin"] {
        assert_eq!(by_service(path), "403", "{path} by the Service");
        assert_eq!(by_pod(path), "403", "{path} by the pod's own address");
    }
    assert_eq!(by_pod("/headers"), "200", "what no policy denies still passes");
    c.down();
}

/// The `path` the echo server saw (its `/headers` answer) for `curl
/// --path-as-is URL` from `deploy/client`, or the HTTP status when it is
/// not 200.
fn path_seen(c: &Cluster, url: &str) -> String {
    let mut a = vec!["exec", "--privileged", "-n", "shop", "deploy/client", "--"];
    a.extend(AS_USER);
    a.extend(["curl", "-sS", "--max-time", "5", "--path-as-is", "-w", "\n%{http_code}", url]);
    let out = String::from_utf8_lossy(&c.run(&a).stdout).into_owned();
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", &out));
    if status != "200" {
        return status.to_string();
    }
    serde_json::from_str::<serde_json::Value>(body)
        .map(|v| v["path"].as_str().unwrap_or("?").to_string())
        .unwrap_or_else(|e| format!("{e}: {body}"))
}

/// Issue 36, item 3: paths are normalized as Istio's MeshConfig says
/// (`pathNormalization`, in the `mesh` key of istio-system's `istio`
/// ConfigMap) before routes, policies and the app see them; a MeshConfig
/// that cannot be read is refused at apply, naming the field.
#[test]
fn paths_are_normalized_as_the_mesh_config_says() {
    let (c, dir) = shop("t-hard-wp-path");
    let url = |p: &str| format!("http://web.shop:8080{p}");
    // BASE, Istio's default: dot segments, encoded dots and backslashes.
    for p in ["/x/../headers", "/x/%2e%2e/headers", "/x\\..\\headers", "/%68eaders"] {
        assert_eq!(path_seen(&c, &url(p)), "/headers", "{p}");
    }
    assert_eq!(path_seen(&c, &url("//headers")), "404", "BASE keeps empty segments");
    let mesh = |mode: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    pathNormalization:\n      normalization: {mode}\n")
    };
    let bad = write_manifest(&dir, "bad-mesh.yaml", &mesh("STRICT"));
    let o = c.run(&["apply", "-f", &bad]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("ConfigMap istio-system/istio: data.mesh: pathNormalization.normalization: \"STRICT\" is not one of"), "{out}");
    let good = write_manifest(&dir, "mesh.yaml", &mesh("DECODE_AND_MERGE_SLASHES"));
    c.ok(&["apply", "-f", &good]);
    wait_until("the waypoint merging slashes", Duration::from_secs(30), || path_seen(&c, &url("//headers")) == "/headers");
    assert_eq!(path_seen(&c, &url("/x%2f..%2fheaders")), "/headers", "encoded slashes decoded, then the dot segment");
    assert_eq!(path_seen(&c, &url("/headers%00")), "400", "an encoded NUL is refused");
    c.down();
}

/// Sends each of `payloads` on its own connection to `web.shop:PORT` from
/// `deploy/client` (as uid 1000), with `pause` seconds between its first
/// byte and the rest; what came back on each, as text.
fn raw_from_client(c: &Cluster, port: u16, payloads: &[&str], pause: f32) -> Vec<String> {
    let script = r#"
import json, socket, sys, time
port, pause, payloads = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
out = []
for p in payloads:
    data = p.encode('latin-1')
    s = socket.create_connection(('web.shop', port), timeout=5)
    s.sendall(data[:1]); time.sleep(pause); s.sendall(data[1:])
    got = b''
    s.settimeout(1.5)
    try:
        while True:
            b = s.recv(65536)
            if not b: break
            got += b
    except OSError:
        pass
    out.append(got.decode('latin-1'))
print(json.dumps(out))
"#;
    let arg = serde_json::to_string(payloads).unwrap();
    let (port, pause) = (port.to_string(), pause.to_string());
    let mut a = vec!["exec", "--privileged", "-n", "shop", "deploy/client", "--"];
    a.extend(AS_USER);
    a.extend(["python3", "-c", script, &port, &pause, &arg]);
    let o = c.run(&a);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {}", String::from_utf8_lossy(&o.stderr)))
}

/// Issue 36, item 4: web's port 8080 is named `http`, so declared HTTP:
/// what a client sends first (a blank line, a lowercase method, a slow
/// first byte, TLS) never turns it into raw TCP around the waypoint's
/// request handling (its `x-request-id` reaches the app) and policies; its
/// port 9000, named `tcp-echo`, is TCP and passes through as it came.
#[test]
fn a_client_cannot_turn_a_port_declared_http_into_raw_tcp_from_inside_a_pod() {
    let (c, _dir) = shop("t-hard-wp-proto");
    let get = "GET /headers HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n";
    let handled = |o: &str| o.starts_with("HTTP/1.1 200") && o.to_ascii_lowercase().contains("x-request-id");
    let outs = raw_from_client(&c, 8080, &[&format!("\r\n{get}"), get, &get.replacen("GET", "get", 1)], 0.0);
    for (what, o) in ["a leading CRLF", "plain"].iter().zip(&outs) {
        assert!(handled(o), "{what}: {o}");
    }
    // The echo server refuses the method `get` (405): the waypoint took it
    // as an HTTP request and logged it, it did not pass it through.
    assert!(outs[2].starts_with("HTTP/1.1 405"), "{}", outs[2]);
    let slow = raw_from_client(&c, 8080, &[get], 1.0);
    assert!(handled(&slow[0]), "a first byte alone for a second: {}", slow[0]);
    let tls = raw_from_client(&c, 8080, &["\u{16}\u{3}\u{1}\u{0}\u{a5}\u{1}\u{0}\u{0}\u{a1}\u{3}\u{3}"], 0.0);
    assert!(tls[0].starts_with("HTTP/1.1 400"), "a TLS ClientHello on the HTTP port: {}", tls[0]);
    // The TCP port is TCP, HTTP-looking or not.
    let echoed = raw_from_client(&c, 9000, &[get], 0.0);
    assert_eq!(echoed[0], get, "echoed as it came");
    // The waypoint logged the refusal.
    let pod = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    let log = c.ok(&["logs", "-n", "shop", &pod]);
    assert!(log.contains("connection refused: not HTTP, on a port declared HTTP"), "{log}");
    assert!(log.lines().any(|l| l.contains("slipstream::access") && l.contains("method=get") && l.contains("code=405")), "{log}");
    c.down();
}

/// Issue 36, item 5: a destination's identity rules hold behind its
/// waypoint. The waypoint decides them with the original client; the
/// destination's node proxy, which sees the waypoint, lets the waypoint
/// through them. `policy check` shows both decisions.
#[test]
fn identity_rules_keep_holding_behind_a_waypoint() {
    let (c, dir) = shop("t-hard-wp-ident");
    let web = c.pods("web-")[0]["ip"].as_str().unwrap().to_string();
    let status = |from: &str, url: &str| status_of(&c, from, url, &[]);
    let svc = "http://web.shop:8080/headers";
    let pod = format!("http://{web}:8080/headers");
    let policy = |spec: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: web-callers, namespace: shop}}\nspec: {spec}\n"
        )
    };
    // A DENY of one caller.
    let deny = write_manifest(
        &dir,
        "deny.yaml",
        &policy("{selector: {matchLabels: {app: web}}, action: DENY, rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/intruder]}}]}]}"),
    );
    c.ok(&["apply", "-f", &deny]);
    wait_until("the DENY in force at the waypoint", Duration::from_secs(30), || status("intruder", svc) == "403");
    assert_eq!(status("intruder", &pod), "403", "by the pod's address too");
    assert_eq!((status("client", svc), status("client", &pod)), ("200".into(), "200".into()));
    // TCP through the waypoint: the intruder's connection is refused too.
    let echoed = {
        let mut a = vec!["exec", "--privileged", "-n", "shop", "deploy/intruder", "--"];
        a.extend(AS_USER);
        a.extend(["python3", "-c", "import socket\ns=socket.create_connection(('web.shop',9000),timeout=5)\ns.sendall(b'ping')\ns.settimeout(3)\ntry:\n    print(s.recv(10).decode() or 'closed')\nexcept OSError:\n    print('closed')\n"]);
        String::from_utf8_lossy(&c.run(&a).stdout).trim().to_string()
    };
    assert_eq!(echoed, "closed", "the intruder's TCP through the waypoint");
    // ALLOW only one caller: that one is served (the node proxy lets the
    // waypoint through), the other is not.
    let allow = write_manifest(
        &dir,
        "allow.yaml",
        &policy("{selector: {matchLabels: {app: web}}, rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/client]}}]}]}"),
    );
    c.ok(&["apply", "-f", &allow]);
    wait_until("the ALLOW in force", Duration::from_secs(30), || status("client", svc) == "200" && status("intruder", svc) == "403");
    assert_eq!((status("client", &pod), status("intruder", &pod)), ("200".into(), "403".into()));
    // policy check names the waypoint hop and both decisions.
    let out = c.ok(&["policy", "check", "--from", "shop/deploy/intruder", "--to", "shop/deploy/web:8080"]);
    assert!(
        out.contains("DENY  through waypoint shop/waypoint (spiffe://cluster.local/ns/shop/sa/waypoint), addressed to service shop/web"),
        "{out}"
    );
    assert!(out.contains("at the waypoint, as shop/deploy/intruder") || out.contains("at the waypoint, as shop/intruder"), "{out}");
    assert!(out.contains("AuthorizationPolicy shop/web-callers"), "the deciding policy: {out}");
    let json: serde_json::Value =
        serde_json::from_str(&c.ok(&["policy", "check", "--from", "shop/deploy/client", "--to", "shop/deploy/web:8080", "-o", "json"]))
            .unwrap();
    let paths = json["waypoints"].as_array().unwrap_or_else(|| panic!("{json}"));
    assert!(paths.iter().all(|p| p["verdict"] == "allow" && p["at_destination"]["istio"]["allowed"] == true), "{json:#}");
    c.down();
}

/// Issue 36, item 9: `hosts` and a trailing dot, with ALLOW and DENY; and
/// `remoteIpBlocks` read from `X-Forwarded-For` only past the proxies
/// MeshConfig trusts (`numTrustedProxies`), never from what a pod writes.
#[test]
fn hosts_with_a_trailing_dot_and_forwarded_addresses_hold_from_inside_a_pod() {
    let (c, dir) = shop("t-hard-wp-hosts");
    let svc = "http://web.shop:8080/headers";
    let status = |host: &str, extra: &[&str]| {
        let mut h = vec!["-H", host];
        h.extend_from_slice(extra);
        status_of(&c, "client", svc, &h)
    };
    let policy = |name: &str, spec: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec: {spec}\n")
    };
    let deny = write_manifest(
        &dir,
        "deny-host.yaml",
        &policy(
            "no-admin-host",
            "{targetRefs: [{kind: Service, name: web}], action: DENY, rules: [{to: [{operation: {hosts: [admin.example.com]}}]}]}",
        ),
    );
    c.ok(&["apply", "-f", &deny]);
    wait_until("the host DENY in force", Duration::from_secs(30), || status("Host: admin.example.com", &[]) == "403");
    for host in ["Host: admin.example.com.", "Host: ADMIN.example.com.:8080", "Host: admin.example.com:8080"] {
        assert_eq!(status(host, &[]), "403", "{host}");
    }
    assert_eq!(status("Host: web.example.com", &[]), "200");
    c.ok(&["delete", "-f", &deny]);
    let allow = write_manifest(
        &dir,
        "allow-host.yaml",
        &policy("only-web-host", "{targetRefs: [{kind: Service, name: web}], rules: [{to: [{operation: {hosts: [web.example.com]}}]}]}"),
    );
    c.ok(&["apply", "-f", &allow]);
    wait_until("the host ALLOW in force", Duration::from_secs(30), || status("Host: other.example.com", &[]) == "403");
    for host in ["Host: web.example.com", "Host: web.example.com.", "Host: WEB.Example.com.:8080"] {
        assert_eq!(status(host, &[]), "200", "{host}");
    }
    c.ok(&["delete", "-f", &allow]);
    // remoteIpBlocks: a pod's own X-Forwarded-For is no address of its own.
    let xff = write_manifest(
        &dir,
        "xff.yaml",
        &policy(
            "no-doc-net",
            "{targetRefs: [{kind: Service, name: web}], action: DENY, rules: [{from: [{source: {remoteIpBlocks: [192.0.2.0/24]}}]}, {to: [{operation: {paths: [/probe]}}]}]}",
        ),
    );
    c.ok(&["apply", "-f", &xff]);
    let forwarded = ["-H", "X-Forwarded-For: 192.0.2.7"];
    // In force once its second rule is: then the pod's own header decides nothing.
    wait_until("the policy in force", Duration::from_secs(30), || status_of(&c, "client", "http://web.shop:8080/probe", &[]) == "403");
    assert_eq!(status("Host: web", &forwarded), "200", "no proxy trusted: a pod's X-Forwarded-For is not its address");
    let mesh = write_manifest(
        &dir,
        "mesh.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    defaultConfig:\n      gatewayTopology:\n        numTrustedProxies: 1\n",
    );
    c.ok(&["apply", "-f", &mesh]);
    wait_until("one trusted proxy: the forwarded address decides", Duration::from_secs(30), || status("Host: web", &forwarded) == "403");
    assert_eq!(status("Host: web", &["-H", "X-Forwarded-For: 192.0.2.7, 198.51.100.1"]), "200", "the rightmost address is the one trusted");
    assert_eq!(status("Host: web", &[]), "200", "without the header: the peer's address");
    c.down();
}

/// The request as the echo server saw it (`/headers`) for `curl URL` from
/// `deploy/client` as uid 1000, with its status: (status, headers).
fn headers_seen(c: &Cluster, url: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let mut a = vec!["exec", "--privileged", "-n", "shop", "deploy/client", "--"];
    a.extend(AS_USER);
    a.extend(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}"]);
    a.extend(extra);
    a.push(url);
    let out = String::from_utf8_lossy(&c.run(&a).stdout).into_owned();
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", &out));
    (status.to_string(), serde_json::from_str::<serde_json::Value>(body).map(|v| v["headers"].clone()).unwrap_or_default())
}

/// Issue 36, item 10: RequestAuthentication at the waypoint, from inside a
/// pod. A token must be valid wherever it is presented (401 otherwise:
/// expired, another issuer, another key), a request without one has no
/// request identity (the policy that asks for one refuses it), the app
/// never gets the token, and a claim header the client writes itself never
/// reaches the app as if the mesh had verified it. A tenant's rule that
/// would write a header the mesh reads (`X-Forwarded-For`) is refused at
/// apply, naming the field.
#[test]
fn request_tokens_are_verified_at_the_waypoint_from_inside_a_pod() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let (c, dir) = shop("t-hard-wp-jwt");
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "shop-1",
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..65])}]});
    let signing = jsonwebtoken::EncodingKey::from_ec_der(&kp.serialize_der());
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let other_signing = jsonwebtoken::EncodingKey::from_ec_der(&other.serialize_der());
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let sign = |claims: serde_json::Value, key: &jsonwebtoken::EncodingKey| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some("shop-1".into());
        format!("Authorization: Bearer {}", jsonwebtoken::encode(&h, &claims, key).unwrap())
    };
    let alice = sign(serde_json::json!({"iss": "https://auth.shop.example", "sub": "alice", "exp": exp}), &signing);
    let bad = [
        ("expired", sign(serde_json::json!({"iss": "https://auth.shop.example", "sub": "alice", "exp": 1000}), &signing)),
        ("another issuer", sign(serde_json::json!({"iss": "https://evil.example", "sub": "alice", "exp": exp}), &signing)),
        ("another key", sign(serde_json::json!({"iss": "https://auth.shop.example", "sub": "alice", "exp": exp}), &other_signing)),
        ("not a token", "Authorization: Bearer e30.e30.AAAA".to_string()),
    ];
    let ra = |header: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: shop}}\nspec:\n  targetRefs: [{{kind: Service, name: web}}]\n  jwtRules:\n  - issuer: https://auth.shop.example\n    jwks: '{jwks}'\n    outputClaimToHeaders: [{{header: {header}, claim: sub}}]\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: require-jwt, namespace: shop}}\nspec:\n  targetRefs: [{{kind: Service, name: web}}]\n  action: DENY\n  rules: [{{from: [{{source: {{notRequestPrincipals: ['*']}}}}], to: [{{operation: {{paths: [/private]}}}}]}}]\n"
        )
    };
    // A rule writing a header the mesh reads is refused, and nothing is applied.
    let hostile = write_manifest(&dir, "hostile-jwt.yaml", &ra("X-Forwarded-For"));
    let o = c.run(&["apply", "-f", &hostile]);
    let out = text(&o);
    assert!(!o.status.success(), "accepted:\n{out}");
    assert!(out.contains("RequestAuthentication shop/jwt: spec.jwtRules[0].outputClaimToHeaders[0].header"), "{out}");
    let private = "http://web.shop:8080/private";
    assert_eq!(status_of(&c, "client", private, &[]), "404", "nothing of the refused apply is in force");
    c.ok(&["apply", "-f", &write_manifest(&dir, "jwt.yaml", &ra("X-User"))]);
    wait_until("a token required on /private", Duration::from_secs(30), || status_of(&c, "client", private, &[]) == "403");
    assert_eq!(status_of(&c, "client", private, &["-H", &alice]), "404", "a valid token passes (the echo server has no /private)");
    for (what, token) in &bad {
        assert_eq!(status_of(&c, "client", "http://web.shop:8080/headers", &["-H", token]), "401", "{what}");
        assert_eq!(status_of(&c, "client", private, &["-H", token]), "401", "{what}");
    }
    // Without a token: no identity, and a forged X-User does not reach the app.
    let (status, seen) = headers_seen(&c, "http://web.shop:8080/headers", &["-H", "X-User: admin"]);
    assert_eq!(status, "200");
    assert!(seen.get("x-user").is_none(), "a client's own X-User reached the app: {seen}");
    // With one: the app gets the verified claim and not the token.
    let (status, seen) = headers_seen(&c, "http://web.shop:8080/headers", &["-H", "X-User: admin", "-H", &alice]);
    assert_eq!(status, "200");
    assert_eq!(seen["x-user"], "alice", "{seen}");
    assert!(seen.get("authorization").is_none(), "the token reached the app: {seen}");
    c.down();
}

/// Python run in a pod: opens `web.shop:8080` six times and on each sends
/// an HTTP/2 rapid reset (2 000 streams opened and cancelled at once),
/// reading until the waypoint closes it.
const RAPID_RESET: &str = r#"
import socket, struct
def frame(t, f, s, p): return struct.pack('>I', len(p))[1:] + bytes([t, f]) + struct.pack('>I', s) + p
pre = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(4, 0, 0, b'')
hb = bytes([0x82, 0x86, 0x84, 0x41, 13]) + b'web.shop:8080'
flood = pre + b''.join(frame(1, 5, 2 * i + 1, hb) + frame(3, 0, 2 * i + 1, struct.pack('>I', 8)) for i in range(2000))
for i in range(6):
    try:
        s = socket.create_connection(('web.shop', 8080), timeout=5)
        s.sendall(flood)
        while s.recv(65536):
            pass
    except OSError:
        pass
print('done')
"#;

/// Issue 36, item 6, from inside a pod: a pod that breaks HTTP/2 on
/// purpose (rapid resets) is cooled down at the waypoint, and its own
/// node proxy refuses its next connections there (`retry-after`), while
/// another pod is served throughout; once cooled down it is served again.
#[test]
fn a_pod_breaking_http2_on_purpose_is_cooled_down_and_no_one_else_is() {
    let (c, _dir) = shop("t-hard-wp-fair");
    let url = "http://web.shop:8080/headers";
    assert_eq!(status_of(&c, "intruder", url, &[]), "200", "served before");
    let mut a = vec!["exec", "--privileged", "-n", "shop", "deploy/intruder", "--"];
    a.extend(AS_USER);
    a.extend(["python3", "-c", RAPID_RESET]);
    let o = c.run(&a);
    assert!(String::from_utf8_lossy(&o.stdout).contains("done"), "{}", text(&o));
    // Cooled down: refused (by its node proxy) while the client is served.
    assert_eq!(status_of(&c, "intruder", url, &[]), "000", "the pod that broke HTTP/2 is still served");
    for _ in 0..5 {
        assert_eq!(status_of(&c, "client", url, &[]), "200", "another pod suffers");
    }
    let logs = text(&c.run(&["logs", "-n", "shop", "deploy/waypoint"]));
    assert!(logs.contains("broke HTTP/2 on purpose"), "the waypoint says why:\n{logs}");
    // Served again once the cool-down (10 s) is over.
    wait_until("the intruder served again", Duration::from_secs(30), || status_of(&c, "intruder", url, &[]) == "200");
    c.down();
}
