//! The local cluster end to end: up, reach services across nodes by name,
//! apply and delete at runtime, kill -9 parts, and down leaving nothing.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn quickstart_reaches_the_echo_server_on_the_other_node_by_name() {
    let qs = repo().join("examples/quickstart").display().to_string();
    let c = Cluster::up("t-quick", &["-f", &qs]);
    let st = c.status();
    assert_eq!(st["version"], 1);
    assert_eq!(st["nodes"].as_array().unwrap().len(), 2);
    let client = &c.pods("client-")[0];
    let echo = &c.pods("echo-")[0];
    assert_ne!(client["node"], echo["node"], "quickstart places client and server on different nodes");
    assert_eq!(client["serviceAccount"], "client");
    assert_eq!(echo["labels"]["app"], "echo");
    let svc = &st["services"][0];
    assert_eq!(svc["name"], "echo");
    assert!(svc["vip"].as_str().unwrap().starts_with("10.96."));
    assert_eq!(svc["endpoints"][0]["ip"], echo["ip"]);
    assert_eq!(svc["endpoints"][0]["ports"][0]["targetPort"], 8080);

    // Every DNS form of the service name, from the client's pod.
    for host in ["echo", "echo.default", "echo.default.svc", "echo.default.svc.cluster.local"] {
        let (code, out) = c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "5", &format!("http://{host}:8080/headers")]);
        assert_eq!(code, 0, "curl {host} failed: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("echo /headers answers JSON");
        // Plain kernel forwarding keeps the client's own address.
        let seen = v["client_addr"].as_str().unwrap();
        assert!(seen.starts_with(&format!("{}:", client["ip"].as_str().unwrap())), "server saw {seen}");
        assert_eq!(v["server"], echo["name"]);
    }
    // Exact byte counts through the VIP.
    let (code, out) = c.exec(
        "default",
        "deploy/client",
        &["curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{size_download}", "http://echo:8080/echo?size=100000"],
    );
    assert_eq!((code, out.as_str()), (0, "100000"));
    // Pod IP directly, across nodes.
    let (code, _) = c.exec(
        "default",
        "deploy/client",
        &["curl", "-sS", "--max-time", "5", &format!("http://{}:8080/healthz", echo["ip"].as_str().unwrap())],
    );
    assert_eq!(code, 0);
    // exec returns the command's exit code; the pod has its own host name.
    assert_eq!(c.exec("default", "deploy/client", &["sh", "-c", "exit 7"]).0, 7);
    assert_eq!(c.exec("default", "deploy/client", &["hostname"]).1.trim(), client["name"].as_str().unwrap());
    // The examples run as the distroless "nonroot" user, not a likely real
    // user of the machine (1000 is often the operator's own).
    for pod in ["deploy/client", "deploy/echo"] {
        assert_eq!(c.exec("default", pod, &["id", "-u"]).1.trim(), "65532", "{pod}: id -u");
        assert_eq!(c.exec("default", pod, &["id", "-g"]).1.trim(), "65532", "{pod}: id -g");
    }
    // An unknown name fails at once rather than hanging.
    assert_ne!(c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "5", "http://nosuchservice:8080/"]).0, 0);
    // logs show the server's per-request lines.
    let logs = c.ok(&["logs", echo["name"].as_str().unwrap()]);
    assert!(logs.contains("/headers"), "echo logs: {logs}");
    c.down();
}

const WEB: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        command: [slipstream, app, echo, --tcp-port, "0"]
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {tcpSocket: {port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
"#;

const CLIENT: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers: [{name: c, command: [sleep, infinity]}]
"#;

#[test]
fn apply_and_delete_change_the_running_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let client = write_manifest(&dir, "client.yaml", CLIENT);
    let web = write_manifest(&dir, "web.yaml", WEB);
    let c = Cluster::up("t-apply", &["-f", &client, "--nodes", "3"]);
    c.ok(&["apply", "-f", &web]);
    let pods = c.pods("web-");
    assert_eq!(pods.len(), 3);
    let nodes: std::collections::BTreeSet<_> = pods.iter().map(|p| p["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 3, "replicas spread over the nodes: {nodes:?}");
    for p in &pods {
        assert!(std::path::Path::new("/run/netns").join(p["netns"].as_str().unwrap()).exists());
    }
    // Load-balanced through the VIP over every replica, from another namespace.
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, out) = c.exec("default", "client", &["curl", "-sS", "--max-time", "5", "http://web.web/headers"]);
        assert_eq!(code, 0, "{out}");
        served.insert(serde_json::from_str::<serde_json::Value>(&out).unwrap()["server"].as_str().unwrap().to_string());
    }
    assert_eq!(served.len(), 3, "all replicas served: {served:?}");
    // The short name is only for the service's own namespace.
    assert_ne!(c.exec("default", "client", &["curl", "-sS", "--max-time", "3", "http://web/"]).0, 0);

    // Scale down by re-applying: the surplus pods stop and their namespaces go.
    let web1 = write_manifest(&dir, "web1.yaml", &WEB.replace("replicas: 3", "replicas: 1"));
    let out = c.ok(&["apply", "-f", &web1]);
    assert!(out.contains("deployment.apps/web (web) configured"), "{out}");
    assert!(out.contains("namespace/web unchanged"), "{out}");
    let left = c.pods("web-");
    assert_eq!(left.len(), 1);
    for p in &pods {
        if p["name"] != left[0]["name"] {
            assert!(!std::path::Path::new("/run/netns").join(p["netns"].as_str().unwrap()).exists(), "netns of a deleted pod remains");
        }
    }

    let out = c.ok(&["delete", "-f", &web]);
    assert!(out.contains("namespace/web deleted"), "{out}");
    assert!(c.pods("web-").is_empty());
    assert!(c.status()["services"].as_array().unwrap().is_empty());
    assert_ne!(c.exec("default", "client", &["curl", "-sS", "--max-time", "3", "http://web.web/"]).0, 0, "deleted service still resolves");
    c.down();
}

#[test]
fn invalid_manifests_change_nothing() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let bad = write_manifest(&dir, "bad.yaml", &WEB.replace("port: 80, targetPort: http", "port: 99999"));
    let o = run("t-invalid", &["up", "-f", &bad]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("bad.yaml (document 3): Service web/web: spec.ports[0].port: must be between 1 and 65535 (got 99999)"), "{t}");
    assert_clean("t-invalid");

    let client = write_manifest(&dir, "client.yaml", CLIENT);
    let c = Cluster::up("t-invalid", &["-f", &client]);
    let before = c.status();
    // Valid alone, invalid against the cluster: the namespace is missing.
    let orphan = write_manifest(&dir, "orphan.yaml", &WEB.split("---").skip(1).collect::<Vec<_>>().join("---"));
    let o = c.run(&["apply", "-f", &orphan]);
    assert!(!o.status.success());
    assert!(text(&o).contains("Deployment web/web: metadata.namespace: namespace \"web\" does not exist"), "{}", text(&o));
    let after = c.status();
    assert_eq!(before["pods"], after["pods"]);
    assert_eq!(before["services"], after["services"]);
    c.down();
}

#[test]
fn kill_9_of_any_part_and_down_still_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let web = write_manifest(&dir, "web.yaml", &WEB.replace("replicas: 3", "replicas: 2"));
    let c = Cluster::up("t-kill", &["-f", &web]);
    // A container killed with SIGKILL is restarted and becomes ready again.
    let p = &c.pods("web-")[0];
    let pid = p["containers"][0]["pid"].as_i64().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_until("restart", Duration::from_secs(15), || {
        let p2 = c.pods("web-").into_iter().find(|x| x["name"] == p["name"]).unwrap();
        p2["restarts"] == 1 && p2["ready"] == true
    });

    // Second `up` on a live cluster is refused.
    let o = run("t-kill", &["up", "-f", &web]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is already running"), "{}", text(&o));

    // Kill the agent: pods keep serving, status falls back to the state file.
    let agent = c.status()["agent"]["pid"].as_i64().unwrap();
    std::process::Command::new("kill").args(["-9", &agent.to_string()]).status().unwrap();
    wait_until("agent gone", Duration::from_secs(5), || c.status()["agent"]["running"] == false);
    let ip = c.pods("web-")[0]["ip"].as_str().unwrap().to_string();
    assert_eq!(c.exec("web", "deploy/web", &["curl", "-sS", "--max-time", "5", &format!("http://{ip}:8080/healthz")]).0, 0);

    // `up` over a dead agent whose pods still run refuses: it never
    // destroys workloads nobody asked to stop (hardening_cluster.rs has more).
    let o = run("t-kill", &["up", "-f", &web]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("workloads are still running"), "{}", text(&o));

    // With the agent dead, `down` alone removes everything.
    c.down();
    // `down` is idempotent.
    let o = run("t-kill", &["down"]);
    assert!(o.status.success());
    assert!(text(&o).contains("nothing to remove"));
}

#[test]
fn a_crashing_pod_fails_up_with_its_name_reason_and_log() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let crash = write_manifest(
        &dir,
        "crash.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crasher}\nspec:\n  containers: [{name: c, command: [sh, -c, \"echo config missing >&2; exit 3\"]}]\n",
    );
    let _ = run("t-crash", &["down"]);
    let o = run("t-crash", &["up", "-f", &crash, "--timeout", "20s"]);
    let c = Cluster::adopt("t-crash");
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("pod default/crasher is not starting: CrashLoopBackOff: container c exited with code 3"), "{t}");
    assert!(t.contains("config missing"), "the log tail is shown: {t}");
    // A missing binary is a StartError naming the program.
    let missing = write_manifest(
        &dir,
        "missing.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ghost}\nspec:\n  containers: [{name: c, command: [/no/such/binary]}]\n",
    );
    let o = c.run(&["apply", "-f", &missing, "--timeout", "20s"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("pod default/ghost is not starting: StartError: container c: cannot start /no/such/binary"), "{}", text(&o));
    c.down();
}

#[test]
fn bookinfo_serves_its_call_graph_across_nodes() {
    let bi = repo().join("examples/bookinfo").display().to_string();
    let c = Cluster::up("t-bookinfo", &["-f", &bi]);
    assert_eq!(c.status()["pods"].as_array().unwrap().len(), 6);
    let mut versions = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, out) =
            c.exec("bookinfo", "deploy/productpage-v1", &["curl", "-sS", "--max-time", "5", "http://productpage:9080/api/v1/products/0"]);
        assert_eq!(code, 0, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["served_by"], "productpage-v1");
        assert_eq!(v["details"]["served_by"], "details-v1");
        let rv = v["reviews"]["served_by"].as_str().unwrap().to_string();
        if rv != "reviews-v1" {
            assert!(v["reviews"].to_string().contains("ratings-v1"), "reviews v2/v3 call ratings: {v}");
        }
        versions.insert(rv);
    }
    assert_eq!(versions.len(), 3, "all three reviews versions answered: {versions:?}");
    // The namespace is labeled for the mesh: every call crossed it with
    // verified identities (productpage -> reviews, reviews -> ratings).
    assert!(c.status()["pods"].as_array().unwrap().iter().all(|p| p["meshed"] == true));
    let logs: String = ["node1", "node2"]
        .iter()
        .map(|n| std::fs::read_to_string(format!("/run/slipstream/t-bookinfo/nodes/{n}.log")).unwrap_or_default())
        .collect();
    for (src, dst) in [("productpage", "reviews"), ("productpage", "details"), ("reviews", "ratings")] {
        let (s, d) = (
            format!("src.identity=spiffe://cluster.local/ns/bookinfo/sa/bookinfo-{src}"),
            format!("dst.identity=spiffe://cluster.local/ns/bookinfo/sa/bookinfo-{dst}"),
        );
        assert!(
            logs.lines().any(|l| l.contains("direction=inbound") && l.contains(&s) && l.contains(&d)),
            "no mTLS {src} -> {dst} in the node proxies' logs"
        );
    }
    c.down();
}
