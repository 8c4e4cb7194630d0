//! `slipstream policy check --from NS/POD --to NS/POD:PORT`: would the mesh
//! let this connection through, and which policies decide it, asked of the
//! core policy engine without sending traffic.
//!
//! The state is the one a node proxy holds (its `/config_dump`: workloads,
//! Authorization and network-policy resources as received from the
//! control plane), or, with `-f`, the one the control plane would compute
//! from a set of manifests (pods need `status.podIP` there). Exit code 0
//! for both answers; an error (unknown pod, malformed question, no state)
//! exits non-zero.

use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use slipstream_core::policy::engine::{self, Answer, PodName, Question};
use slipstream_core::policy::LayerVerdict;
use slipstream_core::{MeshConfig, MeshState};
use std::path::PathBuf;

/// `NS/POD:PORT`.
pub fn parse_target(s: &str) -> anyhow::Result<(PodName, u16)> {
    let (pod, port) = s.rsplit_once(':').with_context(|| format!("--to {s:?}: expected NAMESPACE/POD:PORT"))?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).with_context(|| format!("--to {s:?}: {port:?} is not a port (1-65535)"))?;
    let pod = pod.parse::<PodName>().map_err(|e| anyhow::anyhow!("--to {e}"))?;
    Ok((pod, port))
}

/// The mesh as one node proxy holds it.
/// What a node proxy holds, as a mesh configuration (its config dump).
pub fn node_state(ctx: &Ctx, node: &str) -> anyhow::Result<MeshConfig> {
    state_of_node(ctx, Some(node))
}

fn state_of_node(ctx: &Ctx, node: Option<&str>) -> anyhow::Result<MeshConfig> {
    let node = match node {
        Some(n) => n.to_string(),
        None => ctx.status()?.nodes.first().map(|n| n.name.clone()).context("the cluster has no nodes")?,
    };
    let dump = crate::cmd::proxy_config::fetch(ctx, &node)?;
    let part = |k: &str| dump.get(k).cloned().unwrap_or(serde_json::Value::Array(vec![]));
    let cfg = serde_json::json!({
        "workloads": part("workloads"),
        "services": part("services"),
        "policies": part("policies"),
        "net_policies": part("networkPolicies"),
    });
    serde_json::from_value(cfg).context("the node proxy's config dump does not hold a mesh configuration")
}

fn state_of_files(files: &[PathBuf]) -> anyhow::Result<MeshConfig> {
    let mut text = String::new();
    for f in files {
        let t = if f.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("reading standard input")?
        } else if f.is_dir() {
            let mut out = String::new();
            let mut entries: Vec<PathBuf> = std::fs::read_dir(f)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for e in entries.into_iter().filter(|e| e.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json")) {
                out.push_str(&std::fs::read_to_string(&e).with_context(|| format!("reading {}", e.display()))?);
                out.push_str("\n---\n");
            }
            out
        } else {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        };
        text.push_str(&t);
        text.push_str("\n---\n");
    }
    slipstream_control::index::mesh_from_manifests(&text, Default::default()).map_err(|errs| {
        let lines: Vec<String> = errs.iter().map(|e| format!("  {e}")).collect();
        anyhow::anyhow!("the manifests were refused:\n{}", lines.join("\n"))
    })
}

pub fn check(ctx: &Ctx, from: &str, to: &str, files: &[PathBuf], node: Option<&str>, output: &str) -> anyhow::Result<()> {
    if output != "table" && output != "json" {
        bail!("unknown output format {output:?}: use table or json");
    }
    let from: PodName = from.parse().map_err(|e| anyhow::anyhow!("--from {e}"))?;
    let (to, port) = parse_target(to)?;
    let cfg = if files.is_empty() { state_of_node(ctx, node)? } else { state_of_files(files)? };
    let (state, refused) = MeshState::from_config(&cfg);
    for r in refused {
        eprintln!("warning: a resource of the state was refused: {r}");
    }
    let answer = engine::check(&state, &Question { from, to, port })?;
    match output {
        "json" => common::out(&format!("{}\n", serde_json::to_string_pretty(&answer)?)),
        _ => common::out(&human(&answer)),
    }
}

fn layer(l: &LayerVerdict) -> String {
    format!("{:<5}  {}", if l.allowed { "allow" } else { "DENY" }, l.explain())
}

/// The answer for people (pure, for tests).
pub fn human(a: &Answer) -> String {
    let how = match &a.source_identity {
        Some(id) => format!("mTLS (HBONE) as {id}"),
        None => "plaintext (not both ends are meshed)".into(),
    };
    let mut out = format!("{}  {} -> {}:{}  {how}\n", a.verdict.to_uppercase(), a.from, a.to, a.port);
    out.push_str(&format!("  source egress        network policy  {}\n", layer(&a.detail.egress)));
    out.push_str(&format!("  destination ingress  network policy  {}\n", layer(&a.detail.ingress.network)));
    out.push_str(&format!("  destination ingress  authorization   {}\n", layer(&a.detail.ingress.istio)));
    for d in &a.detail.ingress.dry_run {
        out.push_str(&format!("  (dry-run {d} would have matched)\n"));
    }
    out
}
