//! The workspace's dependency rules, checked on `cargo metadata` (no root,
//! no network: `--locked --offline`).
//!
//! - The waypoint and the node proxy are siblings over `slipstream-proxy`:
//!   the waypoint links neither the node proxy nor the eBPF datapath.
//! - The test bed (`slipstream-testbed`) is the local cluster: no
//!   production crate depends on it, and the mesh processes' entry points
//!   (`slipstream node`, `control`, `waypoint`) do not call it.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The crates that run in production processes.
const PRODUCTION: &[&str] = &[
    "slipstream-node",
    "slipstream-control",
    "slipstream-waypoint",
    "slipstream-proxy",
    "slipstream-hbone",
    "slipstream-identity",
    "slipstream-core",
    "slipstream-api",
    "slipstream-ebpf",
    "slipstream-k8s",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each workspace package's normal (not dev, not build) dependencies on
/// other workspace packages. `--no-deps`: the workspace's own manifests are
/// all the rule needs, and resolving the whole graph offline would want
/// every platform's crates (Windows ones included) in the local cache.
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = workspace_root().join("Cargo.toml");
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline", "--no-deps", "--manifest-path"])
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("running {cargo} metadata: {e}"));
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let members: BTreeSet<&str> =
        meta["workspace_members"].as_array().expect("workspace_members").iter().filter_map(Value::as_str).collect();
    let mut deps = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        if !members.contains(p["id"].as_str().unwrap_or_default()) {
            continue;
        }
        let name = p["name"].as_str().expect("package name").to_string();
        let normal: BTreeSet<String> = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .map(String::from)
            .collect();
        deps.insert(name, normal);
    }
    // Only workspace packages count.
    let names: BTreeSet<String> = deps.keys().cloned().collect();
    for d in deps.values_mut() {
        d.retain(|n| names.contains(n));
    }
    deps
}

/// Every workspace package `root` depends on, directly or not, through
/// normal dependencies.
fn closure(deps: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    assert!(deps.contains_key(root), "{root} is not a workspace package");
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(p) = todo.pop() {
        for d in deps.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_waypoint_and_the_node_proxy_are_siblings() {
    let deps = normal_dependencies();
    let waypoint = closure(&deps, "slipstream-waypoint");
    for forbidden in ["slipstream-node", "slipstream-ebpf", "slipstream-testbed"] {
        assert!(
            !waypoint.contains(forbidden),
            "slipstream-waypoint depends on {forbidden} (all its normal dependencies: {waypoint:?}): the waypoint and the node proxy are siblings over \
             slipstream-proxy, which holds what both need; the waypoint must link neither the node proxy, nor the eBPF datapath \
             (the node's), nor the test bed (the local cluster). Move what it needs into slipstream-proxy instead."
        );
    }
    assert!(waypoint.contains("slipstream-proxy"), "the waypoint stands on slipstream-proxy: {waypoint:?}");
    assert!(closure(&deps, "slipstream-node").contains("slipstream-proxy"), "so does the node proxy");
}

#[test]
fn no_production_crate_depends_on_the_test_bed() {
    let deps = normal_dependencies();
    for krate in PRODUCTION {
        let all = closure(&deps, krate);
        assert!(
            !all.contains("slipstream-testbed"),
            "{krate} depends on slipstream-testbed (its normal dependencies: {all:?}): the test bed is the local cluster, never part \
             of a production process; what a production process needs (its set-up: slipstream_proxy::process) lives in a production \
             crate, and tests may use the test bed as a dev-dependency only"
        );
    }
}

#[test]
fn the_mesh_processes_entry_points_do_not_call_the_test_bed() {
    let cmd = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cmd");
    for file in ["node.rs", "control.rs", "waypoint.rs"] {
        let path = cmd.join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            !text.contains("slipstream_testbed"),
            "{} refers to slipstream_testbed: the entry points of `slipstream node`, `control` and `waypoint` are production \
             processes, and the test bed is the local cluster, never part of one; use slipstream_proxy::process for their set-up",
            path.display()
        );
    }
}
