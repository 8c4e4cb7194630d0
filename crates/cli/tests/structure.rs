//! The shape of the workspace, checked (issue 38). No root, no network.
//!
//! - The waypoint and the node proxy are siblings over `slipstream-proxy`:
//!   the waypoint links neither the node proxy nor the eBPF datapath
//!   (`cargo metadata --offline`).
//! - The test bed (`slipstream-testbed`) is the local cluster: no
//!   production crate depends on it, and the mesh processes' entry points
//!   (`slipstream node`, `control`, `waypoint`) do not call it.
//! - No crate has a loop between its modules (read from their `crate::`
//!   paths).
//! - No source file is over 600 non-test lines, but the listed ones.
//! - docs/architecture.md's crate graph is the one Cargo.toml gives.

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
            !text.contains("slipstream_testbed") && !text.contains("Ctx"),
            "{} refers to slipstream_testbed: the entry points of `slipstream node`, `control` and `waypoint` are production \
             processes, and the test bed is the local cluster, never part of one (nor is the CLI's Ctx, which finds the local \
             cluster's paths through it: main.rs dispatches these before making one); use slipstream_proxy::process for their set-up",
            path.display()
        );
    }
}

// ----- Module loops inside each crate (issue 38, item 6) -----

/// Which module uses which, inside one crate, at every level: a file
/// `a/b.rs` using `crate::a::c::T` (or `super::c::T`) is an edge b -> c
/// under `a`; using `crate::d` it is an edge a -> d at the top. Read from
/// `crate::`, `super::` and `self::` paths, `{...}` groups included, in
/// non-test code (`tests.rs`, `tests/` and `#[cfg(test)] mod tests`
/// blocks left out, comments too). Nodes are named `parent::child`.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(Vec<String>, PathBuf)> = rust_files(src)
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.iter().any(|p| p == "tests") {
                return None;
            }
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            Some((parts, file))
        })
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &files {
        let code = non_test_code(&std::fs::read_to_string(file).unwrap());
        for path in used_paths(&code, module) {
            // The longest prefix that is a module (a file) of this crate.
            let Some(target) = (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains(p)) else { continue };
            let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            // A module using its own ancestor or descendant is no loop.
            if common == module.len() || common == target.len() {
                continue;
            }
            let parent = module[..common].join("::");
            edges.entry(format!("{parent}::{}", module[common])).or_default().insert(format!("{parent}::{}", target[common]));
        }
    }
    edges
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The code of a file without comments and without its
/// `#[cfg(test)] mod tests { ... }` blocks (braces counted; code after a
/// test module is kept).
fn non_test_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    let mut depth: Option<i64> = None;
    while let Some(line) = lines.next() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(d) = depth.as_mut() {
            *d += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if *d <= 0 {
                depth = None;
            }
            continue;
        }
        if line.trim() == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod tests")) {
            let head = lines.next().unwrap_or("");
            let d = head.matches('{').count() as i64 - head.matches('}').count() as i64;
            depth = (d > 0).then_some(d);
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every module path `code` (of `module`) names with `crate::`, `super::`
/// or `self::`, resolved from the crate root, groups expanded.
fn used_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (root, base) in
        [("crate::", Vec::new()), ("super::", module[..module.len().saturating_sub(1)].to_vec()), ("self::", module.to_vec())]
    {
        for (i, _) in code.match_indices(root) {
            if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue; // `slipstream_crate::`, `super::super::` (read from the first)
            }
            let mut base = base.clone();
            let mut rest = &code[i + root.len()..];
            // `super::super::...`
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            expand(&base, rest, &mut out);
        }
    }
    out
}

/// The paths of one use tree (`a::b::C`, `a::{b, c::{d, e}}`) under `prefix`.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = tree.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        expand(&path, &group[start..i], out);
                        start = i + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if name.is_empty() || name == "self" {
            break;
        }
        path.push(name.clone());
        match rest[name.len()..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    if path.len() > prefix.len() || !prefix.is_empty() {
        out.push(path);
    }
}

/// The loops of a graph: its strongly connected components of more than
/// one node (Tarjan's algorithm), each sorted.
fn loops(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        if let Some(ws) = t.edges.get(v) {
            for w in ws {
                if !t.index.contains_key(w.as_str()) {
                    visit(t, w);
                    let lw = t.low[w.as_str()];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if t.stack.contains(&w.as_str()) {
                    let iw = t.index[w.as_str()];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

#[test]
fn no_crate_has_a_module_loop() {
    let crates = workspace_root().join("crates");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for l in loops(&module_edges(&src)) {
            found.push((name.clone(), l));
        }
    }
    assert!(
        found.is_empty(),
        "module loops inside crates (crate, modules that use each other through `crate::` paths): {found:?}. A loop between \
         modules is a type or helper in the wrong file: move it to the module both can use (its own, or the lower one's)"
    );
}

/// The crate table of docs/architecture.md, from `cargo metadata`.
fn crate_graph_markdown(deps: &BTreeMap<String, BTreeSet<String>>) -> String {
    let short = |n: &str| n.strip_prefix("slipstream-").unwrap_or(n).to_string();
    let mut out = String::from("| crate | uses |\n|---|---|\n");
    for (name, uses) in deps {
        let uses: Vec<String> = uses.iter().map(|u| format!("`{}`", short(u))).collect();
        let uses = if uses.is_empty() { "(none)".to_string() } else { uses.join(", ") };
        out.push_str(&format!("| `{}` | {uses} |\n", short(name)));
    }
    out
}

#[test]
fn the_crate_graph_in_the_architecture_doc_is_the_code_s() {
    let doc_path = workspace_root().join("docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let begin = doc.find("<!-- crate-graph begin").expect("docs/architecture.md has a `<!-- crate-graph begin` marker");
    let body = begin + doc[begin..].find("-->\n").expect("the begin marker ends") + "-->\n".len();
    let end = doc.find("<!-- crate-graph end -->").expect("docs/architecture.md has a `<!-- crate-graph end -->` marker");
    let want = crate_graph_markdown(&normal_dependencies());
    if std::env::var_os("SLIPSTREAM_BLESS").is_some() {
        let new = format!("{}{want}{}", &doc[..body], &doc[end..]);
        std::fs::write(&doc_path, new).unwrap();
        return;
    }
    assert_eq!(
        &doc[body..end],
        want,
        "docs/architecture.md's crate graph differs from Cargo.toml's dependencies; if the change is meant, rewrite it with \
         SLIPSTREAM_BLESS=1 cargo test --release -p slipstream-cli --test structure"
    );
}

// ----- File sizes (issue 38, item 6) -----

/// Non-test lines a source file may have.
const MAX_FILE_LINES: usize = 600;

/// The files still over [`MAX_FILE_LINES`], each with the change that
/// splits it: a new one fails the test, and so does a listed one that is
/// now within the bound (take it off).
const KNOWN_LARGE_FILES: &[(&str, &str)] = &[];

/// A file's lines outside its `#[cfg(test)] mod tests` blocks.
fn non_test_lines(text: &str) -> usize {
    non_test_code(text).lines().count()
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = workspace_root();
    let mut over = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in rust_files(&src) {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
            if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                continue;
            }
            let n = non_test_lines(&std::fs::read_to_string(&file).unwrap());
            if n > MAX_FILE_LINES {
                over.push((rel, n));
            }
        }
    }
    let new: Vec<_> = over.iter().filter(|(f, _)| !KNOWN_LARGE_FILES.iter().any(|(k, _)| k == f)).collect();
    assert!(
        new.is_empty(),
        "source files over {MAX_FILE_LINES} non-test lines: {new:?}. A file that long holds more than one concern: split it \
         into modules a reader finds by name"
    );
    let shrunk: Vec<_> = KNOWN_LARGE_FILES.iter().filter(|(k, _)| !over.iter().any(|(f, _)| f == k)).collect();
    assert!(shrunk.is_empty(), "these listed files are now within {MAX_FILE_LINES} lines: take them off KNOWN_LARGE_FILES: {shrunk:?}");
}
