//! `slipstream proxy-config NODE [workloads|services|policies|certs|all]`:
//! what one node proxy holds (as `istioctl ztunnel-config` shows), read
//! from its admin port (`127.0.0.1:15000/config_dump` in the node's
//! network namespace).

use crate::cmd::status::columns;
use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use serde_json::Value;
use std::time::Duration;

/// What to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Workloads,
    Services,
    Policies,
    Certs,
    /// Everything the proxy reports (JSON only).
    All,
}

impl Section {
    /// By our names and istioctl's (`workload`, `certificates`, `secret`).
    pub fn parse(s: &str) -> Option<Section> {
        Some(match s {
            "workloads" | "workload" | "w" => Section::Workloads,
            "services" | "service" | "svc" | "s" => Section::Services,
            "policies" | "policy" | "p" => Section::Policies,
            "certs" | "certificates" | "certificate" | "secret" | "c" => Section::Certs,
            "all" => Section::All,
            _ => return None,
        })
    }
}

/// The node and section from `proxy-config NODE [SECTION]` or istioctl's
/// `ztunnel-config SECTION [--node NODE]`: each positional is a section
/// name or else a node; the first node by default.
pub fn target(ctx: &Ctx, args: &[String], node: Option<String>) -> anyhow::Result<(String, Section)> {
    let (section, nodes) = split_target(args)?;
    let node = match (node, nodes.as_slice()) {
        (Some(n), []) => n,
        (None, [n]) => n.clone(),
        (None, []) => ctx.status()?.nodes.first().map(|n| n.name.clone()).ok_or_else(|| anyhow::anyhow!("the cluster has no nodes"))?,
        _ => bail!("name one node (positional or --node), not several"),
    };
    Ok((node, section))
}

/// The section and the node names among `args` (pure, for tests).
pub fn split_target(args: &[String]) -> anyhow::Result<(Section, Vec<String>)> {
    let mut section = None;
    let mut nodes = Vec::new();
    for a in args {
        match (Section::parse(a), section) {
            (Some(s), None) => section = Some(s),
            (Some(_), Some(_)) => bail!("one section at a time (workloads, services, policies, certificates or all)"),
            (None, _) => nodes.push(a.clone()),
        }
    }
    Ok((section.unwrap_or(Section::Workloads), nodes))
}

/// The node proxy's config dump, fetched inside the node's namespace.
pub fn fetch(ctx: &Ctx, node: &str) -> anyhow::Result<Value> {
    common::require_root("proxy-config")?;
    let st = ctx.status()?;
    let Some(n) = st.nodes.iter().find(|n| n.name == node) else {
        let names: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
        bail!("no node {node:?} in cluster {:?} (nodes: {})", ctx.paths.cluster.as_str(), names.join(", "));
    };
    let ns = slipstream_testbed::names::netns_path(&n.netns);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], slipstream_core::ADMIN_PORT));
    let got = slipstream_testbed::sys::netns::in_netns(&ns, move || {
        slipstream_testbed::agent::probe::http_get(addr, "/config_dump", Duration::from_secs(5), 64 << 20)
    })
    .with_context(|| format!("entering {}", ns.display()))?;
    let (code, body) = got.map_err(|e| anyhow::anyhow!("the node proxy of {node} did not answer: {e}"))?;
    if code != 200 {
        bail!("the node proxy of {node} answered HTTP {code}: {}", body.lines().next().unwrap_or(""));
    }
    serde_json::from_str(&body).context("the node proxy's config dump is not JSON")
}

pub fn run(ctx: &Ctx, node: &str, section: Section, output: &str) -> anyhow::Result<()> {
    let dump = fetch(ctx, node)?;
    show(&dump, section, output)
}

/// Prints one section of a node proxy's config dump (the local cluster's
/// and a Kubernetes install's alike).
pub fn show(dump: &Value, section: Section, output: &str) -> anyhow::Result<()> {
    let key = match section {
        Section::Workloads => "workloads",
        Section::Services => "services",
        Section::Policies => "policies",
        Section::Certs => "certificates",
        Section::All => "",
    };
    match output {
        "json" => {
            let v = if key.is_empty() { dump } else { &dump[key] };
            common::out(&format!("{}\n", serde_json::to_string_pretty(v)?))
        }
        "table" => {
            if section == Section::All {
                bail!("`all` is shown as JSON only: add -o json, or pick workloads, services, policies or certs");
            }
            common::out(&table(section, &dump[key]))
        }
        other => bail!("unknown output format {other:?}: use table or json"),
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The table of one section (pure, for tests).
pub fn table(section: Section, items: &Value) -> String {
    let empty = Vec::new();
    let items = items.as_array().unwrap_or(&empty);
    let mut rows: Vec<Vec<String>> = Vec::new();
    match section {
        Section::Workloads => {
            rows.push(["NAMESPACE", "POD NAME", "ADDRESS", "NODE", "IDENTITY", "PROTOCOL", "STATUS"].map(String::from).to_vec());
            for w in items {
                let addrs: Vec<String> = w["addresses"].as_array().unwrap_or(&empty).iter().map(s).collect();
                let sa =
                    if w["service_account"].as_str().unwrap_or("").is_empty() { "default".to_string() } else { s(&w["service_account"]) };
                let td =
                    if w["trust_domain"].as_str().unwrap_or("").is_empty() { "cluster.local".to_string() } else { s(&w["trust_domain"]) };
                let proto = match w["tunnel_protocol"].as_str() {
                    Some("HBONE") => "HBONE",
                    _ => "TCP",
                };
                rows.push(vec![
                    s(&w["namespace"]),
                    s(&w["name"]),
                    addrs.join(","),
                    s(&w["node"]),
                    format!("spiffe://{td}/ns/{}/sa/{sa}", w["namespace"].as_str().unwrap_or("")),
                    proto.into(),
                    s(&w["status"]),
                ]);
            }
        }
        Section::Services => {
            rows.push(["NAMESPACE", "SERVICE NAME", "SERVICE VIP", "PORTS"].map(String::from).to_vec());
            for v in items {
                let vips: Vec<String> = v["addresses"].as_array().unwrap_or(&empty).iter().map(|a| s(&a["address"])).collect();
                let ports: Vec<String> = v["ports"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .map(|p| match p["target_port"].as_u64() {
                        Some(0) | None => format!("{}", p["service_port"]),
                        Some(t) => format!("{}->{t}", p["service_port"]),
                    })
                    .collect();
                rows.push(vec![
                    s(&v["namespace"]),
                    s(&v["name"]),
                    if vips.is_empty() { "None".into() } else { vips.join(",") },
                    ports.join(","),
                ]);
            }
        }
        Section::Policies => {
            rows.push(["NAMESPACE", "POLICY NAME", "ACTION", "SCOPE", "RULES", "DRY RUN"].map(String::from).to_vec());
            for p in items {
                let rules = p["rules"].as_array().map(|r| r.len()).unwrap_or(0);
                rows.push(vec![s(&p["namespace"]), s(&p["name"]), s(&p["action"]), s(&p["scope"]), rules.to_string(), s(&p["dry_run"])]);
            }
        }
        Section::Certs => {
            rows.push(["IDENTITY", "STATE", "SERIAL", "NOT BEFORE", "NOT AFTER", "RENEW AT"].map(String::from).to_vec());
            for c in items {
                let state = match c["error"].as_str() {
                    Some(e) => format!("{} ({e})", s(&c["state"])),
                    None => s(&c["state"]),
                };
                rows.push(vec![s(&c["identity"]), state, s(&c["serial"]), s(&c["notBefore"]), s(&c["notAfter"]), s(&c["renewAt"])]);
            }
        }
        Section::All => {}
    }
    if rows.len() == 1 {
        return format!("{}(none)\n", columns(&rows));
    }
    columns(&rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_orders_of_arguments() {
        let v = |a: &[&str]| super::split_target(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map_err(|e| e.to_string());
        assert_eq!(v(&["node1", "services"]).unwrap(), (super::Section::Services, vec!["node1".to_string()]));
        assert_eq!(v(&["workloads"]).unwrap(), (super::Section::Workloads, vec![]));
        assert_eq!(v(&["certificates", "node2"]).unwrap(), (super::Section::Certs, vec!["node2".to_string()]));
        assert_eq!(v(&[]).unwrap(), (super::Section::Workloads, vec![]));
        assert!(v(&["workloads", "services"]).is_err());
    }

    use super::*;

    #[test]
    fn tables() {
        let w = serde_json::json!([{"uid": "c//Pod/default/a", "name": "a", "namespace": "default", "addresses": ["10.244.1.2"],
            "node": "node1", "tunnel_protocol": "HBONE", "service_account": "", "trust_domain": "", "status": "HEALTHY"}]);
        let t = table(Section::Workloads, &w);
        assert!(
            t.contains("default    a         10.244.1.2  node1  spiffe://cluster.local/ns/default/sa/default  HBONE     HEALTHY"),
            "{t}"
        );
        let v = serde_json::json!([{"name": "echo", "namespace": "default", "addresses": [{"network": "", "address": "10.96.0.10"}],
            "ports": [{"service_port": 80, "target_port": 8080}, {"service_port": 81, "target_port": 0}]}]);
        let t = table(Section::Services, &v);
        assert!(t.contains("10.96.0.10") && t.contains("80->8080,81"), "{t}");
        assert!(table(Section::Policies, &serde_json::json!([])).ends_with("(none)\n"));
    }
}
