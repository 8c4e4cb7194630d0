//! `slipstream proxy-status`: every node proxy, the control plane replica
//! it is connected to, and whether it acknowledged everything it was sent
//! (as `istioctl proxy-status`). Read from each replica's `/debug/syncz`
//! (127.0.0.1:15014 in its network namespace).

use crate::cmd::status::columns;
use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use slipstream_control::syncz::{ProxySync, Syncz};
use slipstream_testbed::status::ClusterStatus;
use std::time::Duration;

/// Each replica's answer, or why there is none.
pub fn fetch(ctx: &Ctx, st: &ClusterStatus) -> Vec<(String, Result<Syncz, String>)> {
    st.control
        .iter()
        .map(|c| {
            let ns = slipstream_testbed::names::netns_path(&c.netns);
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], slipstream_core::abi::CONTROL_MONITOR_PORT));
            let got = slipstream_testbed::sys::netns::in_netns(&ns, move || {
                slipstream_testbed::agent::probe::http_get(addr, "/debug/syncz", Duration::from_secs(5), 16 << 20)
            });
            let r = match got {
                Err(e) => Err(format!("cannot enter {}: {e}", ns.display())),
                Ok(Err(e)) => Err(e),
                Ok(Ok((200, body))) => serde_json::from_str::<Syncz>(&body).map_err(|e| format!("unreadable /debug/syncz: {e}")),
                Ok(Ok((code, body))) => Err(format!("answered HTTP {code}: {}", body.lines().next().unwrap_or(""))),
            };
            let _ = ctx;
            (c.name.clone(), r)
        })
        .collect()
}

pub fn run(ctx: &Ctx, output: &str) -> anyhow::Result<()> {
    common::require_root("proxy-status")?;
    let st = ctx.status()?;
    if st.control.is_empty() {
        bail!("cluster {:?} has no control plane (created by an older version?)", ctx.paths.cluster.as_str());
    }
    let replies = fetch(ctx, &st);
    match output {
        "json" => {
            let v: Vec<serde_json::Value> = replies
                .iter()
                .map(|(name, r)| match r {
                    Ok(s) => serde_json::to_value(s).unwrap_or_default(),
                    Err(e) => serde_json::json!({"replica": name, "error": e}),
                })
                .collect();
            common::out(&format!("{}\n", serde_json::to_string_pretty(&v).context("encoding")?))
        }
        "table" => {
            let nodes: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
            common::out(&table(&nodes, &replies))
        }
        other => bail!("unknown output format {other:?}: use table or json"),
    }
}

fn type_state(p: &ProxySync, ty: &str) -> String {
    match p.types.iter().find(|t| t.type_name == ty) {
        None => "NOT SENT".into(),
        Some(t) if !t.last_nack.is_empty() && !t.in_sync => format!("NACKED ({})", t.last_nack),
        Some(t) if t.in_sync => format!("SYNCED ({})", t.resources),
        Some(t) => format!("STALE (sent {}, acked {})", t.sent_nonce, if t.acked_nonce.is_empty() { "none" } else { &t.acked_nonce }),
    }
}

/// The table (pure, for tests): one row per node proxy connection, and a
/// row for each node with none.
pub fn table(nodes: &[String], replies: &[(String, Result<Syncz, String>)]) -> String {
    let mut rows = vec![["NODE", "CONTROL PLANE", "ADDRESS", "AUTHORIZATION", "CONNECTED", "PROXY ID"].map(String::from).to_vec()];
    let mut seen = std::collections::BTreeSet::new();
    let mut notes = String::new();
    for (name, r) in replies {
        match r {
            Ok(s) => {
                let mut ps: Vec<&ProxySync> = s.proxies.iter().collect();
                ps.sort_by(|a, b| a.node.cmp(&b.node));
                for p in ps {
                    seen.insert(p.node.clone());
                    rows.push(vec![
                        p.node.clone(),
                        name.clone(),
                        type_state(p, "Address"),
                        type_state(p, "Authorization"),
                        format!("{}s", p.connected_secs),
                        p.id.clone(),
                    ]);
                }
            }
            Err(e) => notes.push_str(&format!("control plane {name}: NOT ANSWERING: {e}\n")),
        }
    }
    for n in nodes {
        if !seen.contains(n) {
            rows.push(vec![n.clone(), "-".into(), "NOT CONNECTED".into(), "-".into(), "-".into(), "-".into()]);
        }
    }
    format!("{}{notes}", columns(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_control::syncz::TypeSync;

    #[test]
    fn table_rows() {
        let t = |ty: &str, in_sync: bool, nack: &str| TypeSync {
            type_name: ty.into(),
            sent_nonce: "7".into(),
            acked_nonce: if in_sync { "7".into() } else { "6".into() },
            resources: 12,
            nacks: u64::from(!nack.is_empty()),
            last_nack: nack.into(),
            in_sync,
        };
        let s = Syncz {
            replica: "control1".into(),
            proxies: vec![ProxySync {
                node: "node1".into(),
                id: "ztunnel~172.18.0.1~node1.slipstream~slipstream.svc.cluster.local".into(),
                types: vec![t("Address", true, ""), t("Authorization", false, "authorization default/x: rules[0]: bad")],
                connected_secs: 5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let out =
            table(&["node1".into(), "node2".into()], &[("control1".into(), Ok(s)), ("control2".into(), Err("connection refused".into()))]);
        assert!(out.contains("node1  control1       SYNCED (12)    NACKED (authorization default/x: rules[0]: bad)"), "{out}");
        assert!(out.contains("node2  -              NOT CONNECTED"), "{out}");
        assert!(out.contains("control plane control2: NOT ANSWERING: connection refused"), "{out}");
    }
}
