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
use slipstream_control::objects::ClusterObject;
use slipstream_core::engine::{self, Answer, PodName, Question};
use slipstream_core::policy::LayerVerdict;
use slipstream_core::{MeshConfig, MeshState};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum PolicyCommand {
    /// May pod FROM open a TCP connection to pod TO on PORT? Answers allow
    /// or deny and names the deciding policy and rule of each layer: the
    /// source's egress and the destination's ingress network policies
    /// (NetworkPolicy, CiliumNetworkPolicy) and the destination's
    /// AuthorizationPolicies and PeerAuthentication (meshed destinations).
    ///
    /// Decided by the node proxies' own engine over the state a node proxy
    /// holds (or, with -f, the state the control plane would compute from
    /// manifests). Exit code 0 for allow and for deny; non-zero when the
    /// question cannot be answered (an unknown pod, a malformed argument).
    /// See docs/authorization.md.
    Check {
        /// The client pod: NAMESPACE/POD, or NAMESPACE/deploy/NAME for the
        /// first pod of a Deployment.
        #[arg(long)]
        from: String,
        /// The server pod and port: NAMESPACE/POD:PORT (or
        /// NAMESPACE/deploy/NAME:PORT).
        #[arg(long)]
        to: String,
        /// Answer from these manifests (files or directories; pods need
        /// status.podIP) instead of the running cluster.
        #[arg(short = 'f', long = "filename")]
        filename: Vec<PathBuf>,
        /// The node proxy whose state to use (default: the first node).
        #[arg(long)]
        node: Option<String>,
        /// `table` or `json`.
        #[arg(short = 'o', long = "output", default_value = "table")]
        output: String,
    },
}

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
    mesh_config_of(&dump)
}

/// The mesh configuration a node proxy's config dump holds.
pub fn mesh_config_of(dump: &serde_json::Value) -> anyhow::Result<MeshConfig> {
    let part = |k: &str| dump.get(k).cloned().unwrap_or(serde_json::Value::Array(vec![]));
    let cfg = serde_json::json!({
        "workloads": part("workloads"),
        "services": part("services"),
        "policies": part("policies"),
        "net_policies": part("networkPolicies"),
    });
    serde_json::from_value(cfg).context("the node proxy's config dump does not hold a mesh configuration")
}

/// The manifests of `files`, as one text.
fn read_files(files: &[PathBuf]) -> anyhow::Result<String> {
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
    Ok(text)
}

fn state_of_files(text: &str) -> anyhow::Result<MeshConfig> {
    slipstream_control::index::mesh_from_manifests(text, Default::default()).map_err(|errs| {
        let lines: Vec<String> = errs.iter().map(|e| format!("  {e}")).collect();
        anyhow::anyhow!("the manifests were refused:\n{}", lines.join("\n"))
    })
}

pub fn check(ctx: &Ctx, from: &str, to: &str, files: &[PathBuf], node: Option<&str>, output: &str) -> anyhow::Result<()> {
    if output != "table" && output != "json" {
        bail!("unknown output format {output:?}: use table or json");
    }
    let question = question(from, to)?;
    if !files.is_empty() {
        return check_manifests(question, files, output);
    }
    let cfg = state_of_node(ctx, node)?;
    // The objects the policies came from, for what this L4 answer cannot
    // say: the cluster's.
    let objects: Vec<ClusterObject> = crate::cmd::kubectl::objects(ctx)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| slipstream_control::objects::parse_value(v).ok().flatten())
        .collect();
    answer(&cfg, question, &objects, output)
}

/// `policy check -f`: over the state the control plane would compute from
/// manifests (no cluster needed).
pub fn check_manifests(question: Question, files: &[PathBuf], output: &str) -> anyhow::Result<()> {
    let text = read_files(files)?;
    let cfg = state_of_files(&text)?;
    let objects = slipstream_control::translate::parse_manifests(&text).unwrap_or_default();
    answer(&cfg, question, &objects, output)
}

/// The question of `--from` and `--to`.
pub fn question(from: &str, to: &str) -> anyhow::Result<Question> {
    let from: PodName = from.parse().map_err(|e| anyhow::anyhow!("--from {e}"))?;
    let (to, port) = parse_target(to)?;
    Ok(Question { from, to, port })
}

/// Answers `question` over `cfg` and prints it, with the warnings the
/// policies among `objects` call for (the local cluster's and a Kubernetes
/// install's alike).
pub fn answer(cfg: &MeshConfig, question: Question, objects: &[ClusterObject], output: &str) -> anyhow::Result<()> {
    if output != "table" && output != "json" {
        bail!("unknown output format {output:?}: use table or json");
    }
    let (state, refused) = MeshState::from_config(cfg);
    for r in refused {
        eprintln!("warning: a resource of the state was refused: {r}");
    }
    let answer = engine::check(&state, &question)?;
    let printed = match output {
        "json" => common::out(&format!("{}\n", serde_json::to_string_pretty(&answer)?)),
        _ => common::out(&human(&answer)),
    };
    for w in l7_warnings(objects, &answer.to) {
        eprintln!("warning: {w}");
    }
    printed
}

/// The AuthorizationPolicies bound by selector (or namespace-wide, or
/// mesh-wide from the root namespace) to the destination pod whose rules
/// name L7 attributes: the answer above gives them the node proxy's L4
/// fail-safe meaning, as `apply` warns. Pure, for tests.
pub fn l7_warnings(objects: &[ClusterObject], to: &PodName) -> Vec<String> {
    use slipstream_control::objects::{Kind, ObjectRef};
    let labels = objects
        .iter()
        .find_map(|o| match o {
            ClusterObject::Pod(p)
                if p.metadata.namespace.as_deref() == Some(to.namespace.as_str())
                    && p.metadata.name.as_deref() == Some(to.name.as_str()) =>
            {
                Some(p.metadata.labels.clone().unwrap_or_default())
            }
            _ => None,
        })
        .unwrap_or_default();
    objects
        .iter()
        .filter_map(|o| match o {
            ClusterObject::AuthorizationPolicy(p) => Some(p),
            _ => None,
        })
        .filter(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or("");
            (ns == to.namespace || ns == slipstream_core::ROOT_NAMESPACE)
                && p.spec.selector.as_ref().is_none_or(|s| slipstream_k8s::expand::selector_matches(&s.match_labels, &labels))
        })
        .filter_map(|p| {
            let (ns, name) = (p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or(""));
            let rules =
                slipstream_control::translate::authorization::l7_rules_at_l4(p, &ObjectRef::new(Kind::AuthorizationPolicy, ns, name));
            (!rules.is_empty()).then(|| {
                format!(
                    "AuthorizationPolicy {ns}/{name}: {} name L7 attributes (methods, paths, hosts, headers or request conditions); \
                     this answer is the node proxy's, which gives them their L4 fail-safe meaning (an ALLOW rule that needs them \
                     matches nothing; a DENY rule denies on its L4 part), as for a connection addressed to the pod. Requests through a \
                     waypoint (to a Service bound to one) are decided there with the whole rule (docs/waypoint.md, \"Policy\")",
                    rules.join(", ")
                )
            })
        })
        .collect()
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
    // Through a waypoint: it decides with the original client (the lines
    // above are its decision), then the destination's node proxy decides
    // on the waypoint's connection.
    for w in &a.waypoints {
        out.push_str(&format!(
            "{}  through waypoint {} ({}), addressed to {}\n",
            w.verdict.to_uppercase(),
            w.waypoint,
            w.waypoint_identity,
            w.via
        ));
        let at = &w.at_waypoint;
        out.push_str(&format!("  at the waypoint, as {}:\n", a.from));
        out.push_str(&format!("    source egress        network policy  {}\n", layer(&at.egress)));
        out.push_str(&format!("    destination ingress  network policy  {}\n", layer(&at.ingress.network)));
        out.push_str(&format!("    destination ingress  authorization   {}\n", layer(&at.ingress.istio)));
        match (&w.at_destination, &w.unreachable) {
            (Some(d), _) => {
                out.push_str("  at the destination's node proxy, as the waypoint:\n");
                out.push_str(&format!("    destination ingress  network policy  {}\n", layer(&d.network)));
                out.push_str(&format!("    destination ingress  authorization   {}\n", layer(&d.istio)));
            }
            (None, Some(why)) => out.push_str(&format!("  the waypoint {why}: refused by the source's node proxy (NO_WAYPOINT)\n")),
            (None, None) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECTS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: billing-0, namespace: production, labels: {app: billing}}
spec: {containers: [{name: app, image: x}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: by-selector, namespace: production}
spec:
  selector: {matchLabels: {app: billing}}
  rules:
  - from: [{source: {principals: ["cluster.local/ns/production/sa/frontend"]}}]
  - to: [{operation: {methods: ["GET"], paths: ["/api/v1/invoices*"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: other-app, namespace: production}
spec:
  selector: {matchLabels: {app: ledger}}
  rules: [{to: [{operation: {methods: ["GET"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: at-the-waypoint, namespace: production}
spec:
  targetRefs: [{kind: Service, group: "", name: billing}]
  rules: [{to: [{operation: {methods: ["GET"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: mesh-wide, namespace: istio-system}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin"]}}]}]
"#;

    #[test]
    fn l7_rules_of_the_destinations_selector_policies_are_named() {
        let objects = slipstream_control::translate::parse_manifests(OBJECTS).unwrap();
        let to = PodName { namespace: "production".into(), name: "billing-0".into() };
        let w = l7_warnings(&objects, &to);
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(w[0].starts_with("AuthorizationPolicy production/by-selector: spec.rules[1] name L7"), "{}", w[0]);
        assert!(w[1].starts_with("AuthorizationPolicy istio-system/mesh-wide: spec.rules[0]"), "{}", w[1]);
        // Another namespace's pod: only the mesh-wide one.
        let elsewhere = PodName { namespace: "shop".into(), name: "web".into() };
        assert_eq!(l7_warnings(&objects, &elsewhere).len(), 1);
    }
}
