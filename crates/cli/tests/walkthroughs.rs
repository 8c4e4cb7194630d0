//! The field's walkthroughs in the local cluster (issue 17): Istio's
//! sample YAML as users download it (images, no commands), and kubectl's
//! verbs with kubectl's flags. Real processes, namespaces and curl.

mod common;
use common::*;
use std::time::Duration;

/// Istio's bookinfo.yaml shape (examples/istio-samples/bookinfo.yaml:
/// images and no commands, emptyDir volumes, env, annotations) runs
/// unchanged: every image runs as the built-in bookinfo service of its
/// version, and the page is put together from all of them.
#[test]
fn istios_bookinfo_yaml_runs_unchanged() {
    require_root();
    let yaml = repo().join("examples/istio-samples/bookinfo.yaml").display().to_string();
    let c = Cluster::up("t-istiobi", &["-f", &yaml]);
    let pods = c.status()["pods"].as_array().unwrap().clone();
    assert_eq!(pods.len(), 6, "{pods:?}");
    assert!(pods.iter().all(|p| p["ready"] == true), "{pods:?}");
    // Each reviews image runs its own version: ask each pod directly.
    for v in ["v1", "v2", "v3"] {
        let (code, out) = c.exec("default", &format!("deploy/reviews-{v}"), &["curl", "-sS", "http://localhost:9080/reviews/0"]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("\"served_by\": \"reviews-{v}\"")) || out.contains(&format!("reviews-{v}")), "{out}");
    }
    // productpage calls details and reviews by their service names.
    let (code, page) = c.exec("default", "deploy/productpage-v1", &["curl", "-sS", "http://productpage:9080/productpage"]);
    assert_eq!(code, 0, "{page}");
    assert!(page.contains("details-v1") && page.contains("reviews-v"), "{page}");

    // Any other image without a command is refused, naming the image and
    // the table, and nothing changes.
    let dir = tempfile::tempdir().unwrap();
    let nginx = write_manifest(
        &dir,
        "nginx.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - {name: web, image: 'docker.io/library/nginx:1.27'}\n",
    );
    let o = c.run(&["apply", "-f", &nginx]);
    assert!(!o.status.success());
    let err = text(&o);
    assert!(err.contains("spec.containers[0].command") && err.contains("nginx:1.27") && err.contains("docs/images.md"), "{err}");
    assert_eq!(c.status()["pods"].as_array().unwrap().len(), 6, "nothing changed");
    c.down();
}

/// One command of a walkthrough and what its output must contain.
struct Step {
    line: String,
    expect: Option<String>,
}

/// The commands of a walkthrough page: every line of its ```sh blocks,
/// with the text after `# =>` as what the output must contain.
fn steps(page: &str) -> Vec<Step> {
    let text = std::fs::read_to_string(repo().join(page)).unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            inside = !inside && l.trim() == "```sh";
            continue;
        }
        let l = l.trim();
        if !inside || l.is_empty() || l.starts_with('#') {
            continue;
        }
        let (cmd, expect) = match l.split_once("# =>") {
            Some((c, e)) => (c.trim(), Some(e.trim().to_string())),
            None => (l, None),
        };
        out.push(Step { line: cmd.to_string(), expect });
    }
    out
}

/// Runs one step as a user's shell would, with kubectl, istioctl and
/// hubble being slipstream (the page's one-time set-up), in the
/// repository, on cluster `cluster`; panics naming the step unless it
/// succeeds and prints what it must.
fn run_step(step: &Step, cluster: &str, tools: &std::path::Path) -> String {
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let o = std::process::Command::new("sh")
        .args(["-c", &step.line])
        .current_dir(repo())
        .env("PATH", path)
        .env("SLIPSTREAM_CLUSTER", cluster)
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "`{}` failed:\n{out}", step.line);
    if let Some(e) = &step.expect {
        assert!(out.contains(e.as_str()), "`{}` did not print {e:?}:\n{out}", step.line);
    }
    out
}

/// The tools' names, as the page's set-up makes them.
fn tools() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for t in ["slipstream", "kubectl", "istioctl", "hubble"] {
        std::os::unix::fs::symlink(bin(), dir.path().join(t)).unwrap();
    }
    dir
}

/// docs/walkthroughs/ambient-bookinfo.md, command for command.
#[test]
fn walkthrough_ambient_bookinfo_with_a_waypoint_canary() {
    require_root();
    let name = "t-walk-bi";
    let _ = run(name, &["down"]);
    let tools = tools();
    let steps = steps("docs/walkthroughs/ambient-bookinfo.md");
    assert!(steps.len() > 10 && steps[0].line == "slipstream up", "the page's commands: {}", steps.len());
    let c = Cluster::adopt(name);
    let (body, down) = steps.split_at(steps.len() - 1);
    for s in body {
        run_step(s, name, tools.path());
    }
    // The 90/10 split, request by request, at the waypoint.
    let script = "for i in $(seq 200); do curl -s http://reviews:9080/reviews/0; echo; done";
    let (code, out) = c.exec("bookinfo", "deploy/productpage-v1", &["sh", "-c", script]);
    assert_eq!(code, 0, "{out}");
    let v2 = out.matches("\"served_by\": \"reviews-v2\"").count();
    let v1 = out.matches("\"served_by\": \"reviews-v1\"").count();
    assert_eq!(v1 + v2, 200, "only v1 and v2 answer: {out}");
    // Binomial(200, 0.1): mean 20, sd 4.2; 4.5 sd either way.
    assert!((2..=39).contains(&v2), "v2 served {v2} of 200");
    run_step(&down[0], name, tools.path());
    assert_clean(name);
}

/// docs/walkthroughs/cilium-istio-billing.md, command for command.
#[test]
fn walkthrough_cilium_and_istio_policies_on_billing_with_the_drop_in_hubble() {
    require_root();
    let name = "t-walk-billing";
    let _ = run(name, &["down"]);
    let tools = tools();
    let steps = steps("docs/walkthroughs/cilium-istio-billing.md");
    assert!(steps.len() > 10 && steps[0].line == "slipstream up", "the page's commands: {}", steps.len());
    let _c = Cluster::adopt(name);
    for s in &steps {
        run_step(s, name, tools.path());
    }
    assert_clean(name);
}

/// kubectl's verbs as scripts use them: exit codes, `-o json` and `-o
/// name` shapes, kubectl's messages.
#[test]
fn kubectl_verbs_keep_kubectls_exit_codes_and_shapes() {
    require_root();
    let c = Cluster::up("t-kubectl", &[]);
    let fails = |args: &[&str], says: &str| {
        let o = c.run(args);
        assert_eq!(o.status.code(), Some(1), "{args:?} exits 1: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?} says {says:?}: {}", text(&o));
    };
    assert_eq!(c.ok(&["create", "namespace", "shop"]).trim(), "namespace/shop created");
    fails(&["create", "namespace", "shop"], "Error from server (AlreadyExists): namespaces \"shop\" already exists");
    // get -o json: one object for one name, a List for several.
    let one: serde_json::Value = serde_json::from_str(&c.ok(&["get", "namespace", "shop", "-o", "json"])).unwrap();
    assert_eq!(
        (one["apiVersion"].as_str(), one["kind"].as_str(), one["metadata"]["name"].as_str()),
        (Some("v1"), Some("Namespace"), Some("shop"))
    );
    let list: serde_json::Value = serde_json::from_str(&c.ok(&["get", "pods", "-o", "json"])).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "the quickstart's client and echo: {list}");
    assert!(items.iter().all(|p| p["kind"] == "Pod" && p["status"]["podIP"].is_string()), "{list}");
    let names = c.ok(&["get", "deploy", "-o", "name"]);
    assert_eq!(names.lines().collect::<Vec<_>>(), ["deployment.apps/client", "deployment.apps/echo"]);
    fails(&["get", "pod", "nope"], "pods \"nope\" not found");
    fails(&["get", "widgets"], "the server doesn't have a resource type \"widgets\"");
    let o = c.run(&["get", "pods", "-n", "shop"]);
    assert!(o.status.success() && text(&o).contains("No resources found in shop namespace."), "{}", text(&o));
    // label: --overwrite, key-, kubectl's refusal.
    assert_eq!(c.ok(&["label", "namespace", "shop", "team=a"]).trim(), "namespace/shop labeled");
    fails(&["label", "namespace", "shop", "team=b"], "'team' already has a value (a), and --overwrite is false");
    c.ok(&["label", "ns/shop", "team=b", "--overwrite"]);
    let sel = c.ok(&["get", "ns", "-l", "team=b", "-o", "name"]);
    assert_eq!(sel.trim(), "namespace/shop");
    c.ok(&["label", "namespace", "shop", "team-"]);
    assert!(c.ok(&["get", "ns", "-l", "team", "-o", "name"]).trim().is_empty());
    assert_eq!(c.ok(&["annotate", "deploy", "echo", "note=hello world"]).trim(), "deployment.apps/echo annotated");
    // apply -n: fills the namespace; another one is refused, nothing changes.
    let dir = tempfile::tempdir().unwrap();
    let sa = write_manifest(&dir, "sa.yaml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: robot}\n");
    assert!(c.ok(&["apply", "-n", "shop", "-f", &sa]).contains("serviceaccount/robot (shop) created"));
    let elsewhere =
        write_manifest(&dir, "sa2.yaml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: robot2, namespace: default}\n");
    fails(&["apply", "-n", "shop", "-f", &elsewhere], "You must pass '--namespace=default'");
    // wait: met, and a timeout that names what did not hold.
    let met = c.ok(&["wait", "--for=condition=Ready", "pod", "--all", "--timeout=30s"]);
    assert_eq!(met.lines().filter(|l| l.ends_with("condition met")).count(), 2, "{met}");
    c.ok(&["wait", "--for=condition=Available", "deploy/echo", "--timeout=10s"]);
    fails(&["wait", "--for=delete", "deploy/echo", "--timeout=1s"], "timed out waiting for the condition on deployments/echo");
    // delete KIND NAME, then wait --for=delete of a pod that is gone.
    let pod = c.ok(&["get", "pods", "-l", "app=echo", "-o", "name"]).trim().to_string();
    assert!(c.ok(&["delete", "deploy", "echo"]).contains("deployment.apps/echo (default) deleted"));
    c.ok(&["wait", "--for=delete", &pod, "--timeout=30s"]);
    fails(&["delete", "deploy", "echo"], "not found");
    assert!(c.run(&["delete", "deploy", "echo", "--ignore-not-found"]).status.success());
    c.down();
}

/// Istio ambient's enrolment: labelling a namespace meshes the pods that
/// already run in it, without restarting them; removing the label takes
/// them out again.
#[test]
fn labelling_a_namespace_enrols_its_running_pods_without_a_restart() {
    require_root();
    let c = Cluster::up("t-enrol", &[]);
    c.ok(&["create", "namespace", "bookinfo"]);
    let yaml = repo().join("examples/istio-samples/bookinfo.yaml").display().to_string();
    c.ok(&["apply", "-n", "bookinfo", "-f", &yaml]);
    let pids = || -> Vec<i64> {
        let st = c.status();
        let mut v: Vec<i64> = st["pods"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["namespace"] == "bookinfo")
            .flat_map(|p| p["containers"].as_array().unwrap().iter().map(|c| c["pid"].as_i64().unwrap_or(0)).collect::<Vec<_>>())
            .collect();
        v.sort();
        v
    };
    let meshed = || c.pods("").iter().filter(|p| p["namespace"] == "bookinfo" && p["meshed"] == true).count();
    let before = pids();
    assert_eq!((before.len(), meshed()), (6, 0));
    let proxied = || -> usize {
        ["node1", "node2"]
            .iter()
            .map(|n| {
                std::fs::read_to_string(format!("/run/slipstream/t-enrol/nodes/{n}.log"))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("src.workload=productpage-v1") && l.contains("direction=outbound"))
                    .count()
            })
            .sum()
    };
    let call = || {
        let (code, out) = c.exec("bookinfo", "deploy/productpage-v1", &["curl", "-sS", "--max-time", "5", "http://reviews:9080/reviews/0"]);
        assert_eq!(code, 0, "{out}");
    };
    call();
    assert_eq!(proxied(), 0, "not meshed yet: productpage's connections go straight");

    c.ok(&["label", "namespace", "bookinfo", "istio.io/dataplane-mode=ambient"]);
    wait_until("every bookinfo pod meshed", Duration::from_secs(20), || meshed() == 6);
    // Captured from the next connection on (capture follows the node
    // proxy by a tick): productpage's call goes through its node proxy.
    wait_until("productpage's call carried by its node proxy", Duration::from_secs(20), || {
        call();
        proxied() > 0
    });
    assert_eq!(pids(), before, "no pod was restarted");

    c.ok(&["label", "namespace", "bookinfo", "istio.io/dataplane-mode-"]);
    wait_until("no bookinfo pod meshed", Duration::from_secs(20), || meshed() == 0);
    std::thread::sleep(Duration::from_millis(500));
    let n = proxied();
    call();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(proxied(), n, "out of the mesh: straight again");
    assert_eq!(pids(), before, "no pod was restarted");
    c.down();
}
