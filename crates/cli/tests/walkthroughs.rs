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
