//! The field's walkthroughs in the local cluster (issue 17): Istio's
//! sample YAML as users download it (images, no commands), and kubectl's
//! verbs with kubectl's flags. Real processes, namespaces and curl.

mod common;
use common::*;

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
