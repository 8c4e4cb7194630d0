//! The waypoint in the local cluster, as a user runs it: bookinfo, then
//! the canary of examples/bookinfo/canary (a waypoint Gateway, `reviews`
//! bound to it, an HTTPRoute splitting 90/10 between v1 and v2). Real
//! processes, namespaces, TLS and curl; the waypoint is a pod the Gateway
//! made, running `slipstream waypoint`.

mod common;
use common::*;
use std::time::Duration;

/// `n` GETs of reviews on one curl (one keep-alive connection, so any
/// split is the waypoint's, request by request), from productpage.
fn reviews(c: &Cluster, n: usize) -> (i32, String) {
    let script = format!("curl -sS --max-time 60 -w '\\n' $(for i in $(seq {n}); do printf 'http://reviews:9080/reviews/0 '; done)");
    c.exec("bookinfo", "deploy/productpage-v1", &["sh", "-c", &script])
}

#[test]
fn bookinfo_canary_through_a_waypoint_and_fail_closed_without_it() {
    require_root();
    let bi = repo().join("examples/bookinfo").display().to_string();
    let canary = repo().join("examples/bookinfo/canary").display().to_string();
    let c = Cluster::up("t-waypoint", &["-f", &bi]);
    let applied = c.ok(&["apply", "-f", &canary]);
    for made in
        ["serviceaccount/waypoint (bookinfo) created", "deployment.apps/waypoint (bookinfo) created", "service/waypoint (bookinfo) created"]
    {
        assert!(applied.contains(made), "{made:?} missing from:\n{applied}");
    }
    // `apply` returns once the waypoint it made is ready and the node
    // proxies know it: the very next request goes through it.
    assert!(applied.contains("pod bookinfo/waypoint-"), "apply waited for the waypoint pod:\n{applied}");
    let (code, out) = reviews(&c, 1);
    assert_eq!(code, 0, "the first request after apply: {out}");
    assert!(out.contains("reviews-v1") || out.contains("reviews-v2"), "{out}");
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    let wp = &c.pods("waypoint-")[0];
    assert_eq!(wp["meshed"], false, "the waypoint is not captured by a node proxy: {wp}");
    // Its Gateway is Programmed, as Gateway API users wait for it.
    let waited = c.ok(&["wait", "--for=condition=Programmed", "gtw/waypoint", "-n", "bookinfo", "--timeout", "30s"]);
    assert!(waited.contains("gateway.gateway.networking.k8s.io/waypoint condition met"), "{waited}");
    let gtw = c.ok(&["get", "gtw", "waypoint", "-n", "bookinfo"]);
    assert!(gtw.lines().next().is_some_and(|h| h.ends_with("PROGRAMMED")) && gtw.contains("True"), "{gtw}");

    let n = 1000;
    let (code, out) = reviews(&c, n);
    assert_eq!(code, 0, "{out}");
    let answers: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&out).into_iter().collect::<Result<_, _>>().unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answers.len(), n);
    let by = |v: &str| answers.iter().filter(|a| a["served_by"] == v).count();
    let (v1, v2, v3) = (by("reviews-v1"), by("reviews-v2"), by("reviews-v3"));
    assert_eq!(v3, 0, "v3 is not a backend of the route");
    assert_eq!(v1 + v2, n);
    // Binomial(1000, 0.1): mean 100, standard deviation 9.5; 5 either way.
    assert!((52..=148).contains(&v2), "v2 served {v2} of {n}");

    // Every request went through the waypoint: one access-log line each,
    // with the caller's verified identity, the route and the endpoint's.
    let pod = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    let log = c.ok(&["logs", "-n", "bookinfo", &pod]);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("slipstream::access") && l.contains("route=bookinfo/reviews.0")).collect();
    assert_eq!(lines.len(), n + 1, "one access-log line per request (and the first one, after apply):\n{log}");
    assert!(lines.iter().all(|l| l.contains("code=200") && l.contains("src=spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage")));
    assert!(lines.iter().all(|l| l.contains("dst=spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews")));

    // Without its waypoint, reviews is refused, never reached around it.
    let deleted = c.ok(&["delete", "-f", &canary]);
    assert!(deleted.contains("deployment.apps/waypoint (bookinfo) deleted"), "{deleted}");
    // The canary's objects are gone, reviews too: put it back, still bound
    // to the waypoint that no longer exists.
    let dir = tempfile::tempdir().unwrap();
    let bound = write_manifest(
        &dir,
        "reviews.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: reviews\n  namespace: bookinfo\n  labels: {app: reviews, istio.io/use-waypoint: waypoint}\nspec:\n  selector: {app: reviews}\n  ports:\n  - {name: http, port: 9080, targetPort: 9080}\n",
    );
    c.ok(&["apply", "-f", &bound]);
    wait_until("the waypoint pod gone", Duration::from_secs(60), || c.pods("waypoint-").is_empty());
    let (code, out) = reviews(&c, 1);
    assert_ne!(code, 0, "reviews answered without its waypoint: {out}");
    wait_until("NO_WAYPOINT in a node proxy's log", Duration::from_secs(10), || {
        ["node1", "node2"].iter().any(|n| {
            std::fs::read_to_string(format!("/run/slipstream/t-waypoint/nodes/{n}.log"))
                .unwrap_or_default()
                .contains("reviews.bookinfo.svc.cluster.local is bound to waypoint bookinfo/waypoint, which does not take this traffic")
        })
    });
    // The Service says so, as Istio's condition (its reason, the waypoint).
    let svc: serde_json::Value = serde_json::from_str(&c.ok(&["get", "svc", "reviews", "-n", "bookinfo", "-o", "json"])).unwrap();
    let bound = svc["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "istio.io/WaypointBound"))
        .unwrap_or_else(|| panic!("no istio.io/WaypointBound on reviews: {svc}"));
    assert_eq!((bound["status"].as_str(), bound["reason"].as_str()), (Some("False"), Some("WaypointNotFound")), "{bound}");
    assert!(bound["message"].as_str().unwrap_or("").contains("bookinfo/waypoint"), "{bound}");
    c.down();
}

/// `curl` from a pod of `production`: the HTTP status and the body.
fn call(c: &Cluster, from: &str, method: &str, path: &str) -> (String, String) {
    let url = format!("http://billing-service.production:8080{path}");
    let (code, out) = c.exec("production", from, &["curl", "-sS", "--max-time", "5", "-X", method, "-w", "\n%{http_code}", &url]);
    assert_eq!(code, 0, "curl {method} {path} from {from}: {out}");
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", &out));
    (status.to_string(), body.to_string())
}

/// The seed policy's refusals at the waypoint: frontend's POST and its GET
/// of another path, and legacy-service's GET, each 403.
fn assert_seed_policy_refuses(c: &Cluster) {
    for (from, method, path) in [
        ("deploy/frontend", "POST", "/api/v1/invoices"),
        ("deploy/frontend", "GET", "/api/v1/admin"),
        ("deploy/legacy-service", "GET", "/api/v1/invoices"),
    ] {
        let (status, body) = call(c, from, method, path);
        assert_eq!((status.as_str(), body.trim_end()), ("403", "RBAC: access denied"), "{method} {path} from {from}");
    }
}

#[test]
fn billing_answers_only_get_invoices_to_frontend_at_the_waypoint() {
    require_root();
    let dir = repo().join("examples/policies/billing-l7").display().to_string();
    let c = Cluster::up("t-waypoint-l7", &["-f", &dir]);
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    // The seed policy: frontend may only GET /api/v1/invoices.
    let (status, body) = call(&c, "deploy/frontend", "GET", "/api/v1/invoices");
    assert_eq!(status, "200", "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(seen.to_string().contains("billing-service"), "billing answered (its /headers, by the route's rewrite): {seen}");
    assert_seed_policy_refuses(&c);
    // Not HTTP is no way around it: the port is declared HTTP (its name),
    // so the waypoint answers what does not parse as HTTP with 400 itself
    // (issue 36); nothing reaches the app as raw TCP.
    let probe = "import socket\ns = socket.create_connection(('billing-service.production', 8080), timeout=5)\ns.sendall(b'\\x00not http')\ntry:\n    print(s.recv(100).decode('latin-1').split('\\r\\n')[0] or 'closed')\nexcept OSError:\n    print('closed')\n";
    let (code, out) = c.exec("production", "deploy/legacy-service", &["python3", "-c", probe]);
    assert_eq!((code, out.trim()), (0, "HTTP/1.1 400 Bad Request"), "garbage to an HTTP port through the waypoint");
    // The access log names the policy of each denial, with the caller.
    let pod = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    let log = c.ok(&["logs", "-n", "production", &pod]);
    let denied: Vec<&str> = log.lines().filter(|l| l.contains("code=403") && l.contains("flags=\"RBAC\"")).collect();
    assert_eq!(denied.len(), 3, "{log}");
    assert!(denied.iter().all(|l| l.contains("policy=production/billing-invoices-only")), "{log}");
    assert!(denied.iter().any(|l| l.contains("src=spiffe://cluster.local/ns/production/sa/legacy-sa")), "{log}");
    c.down();
}

/// `n` GETs of reviews on one curl from productpage, with `end-user`
/// (empty: without); each answer's HTTP status and the version that
/// served it (`-` when the waypoint answered itself).
fn reviews_as(c: &Cluster, user: &str, n: usize) -> Vec<(String, String)> {
    let header = if user.is_empty() { String::new() } else { format!("-H 'end-user: {user}'") };
    let script = format!(
        "curl -sS --max-time 60 {header} -w '\\n@@%{{http_code}}\\n' $(for i in $(seq {n}); do printf 'http://reviews:9080/reviews/0 '; done)"
    );
    let (code, out) = c.exec("bookinfo", "deploy/productpage-v1", &["sh", "-c", &script]);
    assert_eq!(code, 0, "{out}");
    let mut answers = Vec::new();
    let mut body = String::new();
    for line in out.lines() {
        match line.strip_prefix("@@") {
            Some(status) => {
                let by =
                    serde_json::from_str::<serde_json::Value>(body.trim()).ok().and_then(|v| v["served_by"].as_str().map(str::to_string));
                answers.push((status.to_string(), by.unwrap_or_else(|| "-".into())));
                body.clear();
            }
            None => body.push_str(line),
        }
    }
    assert_eq!(answers.len(), n, "{out}");
    answers
}

#[test]
fn bookinfo_virtual_service_and_destination_rule_at_the_waypoint() {
    require_root();
    let bi = repo().join("examples/bookinfo").display().to_string();
    let vs = repo().join("examples/bookinfo/virtual-service").display().to_string();
    let c = Cluster::up("t-waypoint-vs", &["-f", &bi]);
    let applied = c.ok(&["apply", "-f", &vs]);
    assert!(applied.contains("virtualservice.networking.istio.io/reviews (bookinfo) created"), "{applied}");
    assert!(applied.contains("destinationrule.networking.istio.io/reviews (bookinfo) created"), "{applied}");
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    let n = 100;
    let jason = reviews_as(&c, "jason", n);
    assert!(jason.iter().all(|(s, by)| s == "200" && by == "reviews-v3"), "jason sees v3: {jason:?}");
    let others = reviews_as(&c, "", n);
    assert!(others.iter().all(|(s, by)| s == "200" && by == "reviews-v1"), "everyone else v1: {others:?}");
    let tester = reviews_as(&c, "tester", 20);
    assert!(tester.iter().all(|(s, by)| s == "418" && by == "-"), "the injected abort: {tester:?}");
    // The access log names the rule and the flag.
    let pod = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    let log = c.ok(&["logs", "-n", "bookinfo", &pod]);
    assert_eq!(log.lines().filter(|l| l.contains("route=bookinfo/reviews.1") && l.contains("flags=\"FI\"")).count(), 20, "{log}");
    // Istio's request metrics, where Istio's proxies serve them (15020).
    let (code, stats) = c.exec("bookinfo", &pod, &["curl", "-sS", "--max-time", "5", "http://127.0.0.1:15020/stats/prometheus"]);
    assert_eq!(code, 0, "{stats}");
    let count = |needles: &[&str]| -> u64 {
        stats
            .lines()
            .filter(|l| l.starts_with("istio_requests_total{") && needles.iter().all(|n| l.contains(n)))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let v3 = ["destination_workload=\"reviews-v3\"", "response_code=\"200\"", "source_workload=\"productpage-v1\""];
    assert_eq!(count(&v3), n as u64, "{stats}");
    assert_eq!(count(&["response_code=\"418\"", "response_flags=\"FI\""]), 20, "{stats}");
    // A LocalRateLimitPolicy on jason's route (the VirtualService's first):
    // 5 an hour, so the bucket does not refill during the test.
    let dir = tempfile::tempdir().unwrap();
    let limit = write_manifest(
        &dir,
        "limit.yaml",
        "apiVersion: slipstream.io/v1alpha1\nkind: LocalRateLimitPolicy\nmetadata: {name: jason, namespace: bookinfo}\nspec:\n  targetRefs: [{group: networking.istio.io, kind: VirtualService, name: reviews, sectionName: '0'}]\n  limit: {requests: 5, interval: 1h}\n",
    );
    let applied = c.ok(&["apply", "-f", &limit]);
    assert!(applied.contains("localratelimitpolicy.slipstream.io/jason (bookinfo) created"), "{applied}");
    // Once the policy has arrived, 5 jason requests pass and then every
    // one is refused (how many passed before it arrived is not known).
    let mut passed_before = 0;
    while reviews_as(&c, "jason", 1)[0].0 != "429" {
        passed_before += 1;
        assert!(passed_before < 200, "no 429 after 200 requests: the limit never arrived");
    }
    let after = reviews_as(&c, "jason", 5);
    assert!(after.iter().all(|(s, by)| s == "429" && by == "-"), "{after:?}");
    let others = reviews_as(&c, "", 10);
    assert!(others.iter().all(|(s, _)| s == "200"), "other routes are not limited: {others:?}");
    let (code, headers) = c.exec(
        "bookinfo",
        "deploy/productpage-v1",
        &["curl", "-sS", "-o", "/dev/null", "-D", "-", "-H", "end-user: jason", "http://reviews:9080/reviews/0"],
    );
    assert_eq!(code, 0, "{headers}");
    let retry_after: u64 = headers
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no retry-after in {headers}"));
    assert!((600..=720).contains(&retry_after), "retry-after {retry_after} (a token every 720 s)");
    let log = c.ok(&["logs", "-n", "bookinfo", &pod]);
    assert!(log.lines().filter(|l| l.contains("flags=\"RL\"") && l.contains("policy=bookinfo/jason")).count() >= 7, "{log}");
    c.ok(&["delete", "-f", &limit]);
    // A field we cannot honour is refused at apply, naming it, and changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let bad = write_manifest(
        &dir,
        "bad.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: bookinfo}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{uri: {regex: '/reviews/.*'}}]\n    route: [{destination: {host: reviews, subset: v2}}]\n",
    );
    let o = c.run(&["apply", "-f", &bad]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("VirtualService bookinfo/reviews") && out.contains("spec.http[0].match[0].uri.regex"), "{out}");
    let again = reviews_as(&c, "jason", 10);
    assert!(again.iter().all(|(_, by)| by == "reviews-v3"), "the refused object changed nothing: {again:?}");
    // Deleting them: the service's own endpoints again, all three versions.
    c.ok(&["delete", "-f", &vs]);
    c.down();
}

/// The seed policy as a team moving from sidecars has it: bound by
/// `selector`, with methods and paths. Behind the waypoint it is enforced
/// there unchanged, with the original client; at the node proxies its L4
/// meaning still holds for what does not pass the waypoint.
#[test]
fn a_sidecar_era_selector_policy_with_l7_fields_is_enforced_at_the_waypoint() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let examples = repo().join("examples/policies/billing-l7");
    for f in ["00-apps.yaml", "10-waypoint.yaml"] {
        std::fs::copy(examples.join(f), dir.path().join(f)).unwrap();
    }
    let policy = std::fs::read_to_string(examples.join("20-allow-invoices.yaml")).unwrap().replace(
        "  targetRefs:\n  - {kind: Service, group: \"\", name: billing-service}\n",
        "  selector:\n    matchLabels: {app: billing-service}\n",
    );
    assert!(policy.contains("matchLabels: {app: billing-service}"), "{policy}");
    std::fs::write(dir.path().join("20-allow-invoices.yaml"), &policy).unwrap();
    let c = Cluster::up("t-waypoint-sel", &["-f", &dir.path().display().to_string()]);
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    let (status, body) = call(&c, "deploy/frontend", "GET", "/api/v1/invoices");
    assert_eq!(status, "200", "{body}");
    assert_seed_policy_refuses(&c);
    let pod = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    let log = c.ok(&["logs", "-n", "production", &pod]);
    let denied: Vec<&str> = log.lines().filter(|l| l.contains("code=403") && l.contains("flags=\"RBAC\"")).collect();
    assert_eq!(denied.len(), 3, "{log}");
    assert!(denied.iter().all(|l| l.contains("policy=production/billing-invoices-only")), "{log}");
    // Around the waypoint, to the pod's own address: the node proxy holds
    // the policy's L4 meaning (its rule needs L7: it allows only the
    // waypoint), so even frontend's GET is refused there.
    let billing_ip = c.pods("billing-service-")[0]["ip"].as_str().unwrap().to_string();
    let (code, out) = c.exec(
        "production",
        "deploy/frontend",
        &["curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://{billing_ip}:8080/api/v1/invoices")],
    );
    assert!(code != 0 && out.trim() != "200", "the pod answered around its waypoint: {code} {out}");
    // `policy check` gives that same L4 answer and says which rule it
    // could not decide at L4.
    let o = c.run(&["policy", "check", "--from", "production/deploy/frontend", "--to", "production/deploy/billing-service:8080"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.starts_with("DENY"), "{out}{err}");
    assert!(
        err.contains("warning: AuthorizationPolicy production/billing-invoices-only: spec.rules[0] name L7 attributes"),
        "no L7 warning from policy check:\n{out}{err}"
    );
    c.down();
}

/// `kubectl rollout restart` of the waypoint while fortio sends 400
/// requests a second through it: the new waypoint pod starts first, the
/// old one gets SIGTERM only once the new one is ready, and drains (HTTP/1
/// answers close their connections, so callers reconnect through the node
/// proxy to the new pod between requests). No request is lost.
#[test]
fn a_waypoint_restarted_under_load_loses_no_request() {
    require_root();
    let bi = repo().join("examples/bookinfo").display().to_string();
    let canary = repo().join("examples/bookinfo/canary").display().to_string();
    let c = Cluster::up("t-wprestart", &["-f", &bi]);
    c.ok(&["apply", "-f", &canary]);
    wait_until("the waypoint pod ready", Duration::from_secs(60), || c.pods("waypoint-").first().is_some_and(|p| p["ready"] == true));
    let old = c.pods("waypoint-")[0]["name"].as_str().unwrap().to_string();
    // The old pod's log, followed while it drains (it is deleted after).
    let mut follow = std::process::Command::new(bin())
        .args(["--cluster", &c.name, "logs", "-f", "-n", "bookinfo", &old])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let old_log = Collected::new(follow.stdout.take().unwrap());

    let (conns, qps, secs) = (8, 400, 12);
    let load = {
        let name = c.name.clone();
        std::thread::spawn(move || {
            let (c, q, t) = (conns.to_string(), qps.to_string(), format!("{secs}s"));
            let args =
                ["exec", "-n", "bookinfo", "deploy/productpage-v1", "--", "fortio", "load", "-quiet", "-c", &c, "-qps", &q, "-t", &t];
            let mut a: Vec<&str> = args.to_vec();
            a.extend(["-json", "-", "http://reviews:9080/reviews/0"]);
            run(&name, &a)
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let restarted = c.ok(&["rollout", "restart", "-n", "bookinfo", "deploy/waypoint"]);
    assert_eq!(restarted.trim(), "deployment.apps/waypoint restarted");
    let status = c.ok(&["rollout", "status", "-n", "bookinfo", "deploy/waypoint", "--timeout", "60s"]);
    assert!(status.contains("deployment \"waypoint\" successfully rolled out"), "{status}");
    let now: Vec<String> = c.pods("waypoint-").iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(now.len(), 1, "one waypoint pod after the rollout: {now:?}");
    assert_ne!(now[0], old, "the waypoint pod was replaced");

    let o = load.join().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "fortio: {}", text(&o));
    let f: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("fortio json: {e}: {out}"));
    let total = f["DurationHistogram"]["Count"].as_u64().unwrap();
    assert_eq!(f["RetCodes"]["200"].as_u64(), Some(total), "every request answered 200 through the restart: {}", f["RetCodes"]);
    assert!(total >= (qps * secs * 8 / 10) as u64, "fortio kept its rate: {total} requests");
    // The callers moved: fortio opened connections beyond its first ones.
    let sockets = f["SocketCount"].as_u64().unwrap_or(0);
    assert!(sockets > conns as u64, "fortio reconnected to the new waypoint: {sockets} sockets");

    // The old waypoint drained and exited by itself (before its grace ran out).
    wait_until("the old waypoint's log closed", Duration::from_secs(20), || follow.try_wait().unwrap().is_some());
    let log = old_log.finish();
    assert!(log.contains("SIGTERM: draining"), "{log}");
    assert!(log.contains("drained; exiting complete=true"), "{log}");
    let served_old = log.lines().filter(|l| l.contains("slipstream::access") && l.contains("code=200")).count();
    let new_log = c.ok(&["logs", "-n", "bookinfo", &now[0]]);
    let served_new = new_log.lines().filter(|l| l.contains("slipstream::access") && l.contains("code=200")).count();
    assert!(served_old > 0 && served_new > 0, "both waypoints served: old {served_old}, new {served_new}");
    assert_eq!(
        served_old + served_new,
        total as usize + conns,
        "every request (and fortio's warm-up) logged once: {served_old} + {served_new}"
    );
    c.down();
}
