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
        "json" => json(&replies),
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
        // The last answer was this NACK (an ACK since would be newer).
        Some(t) if !t.last_nack.is_empty() && t.last_nack_generation >= p.acked_generation => format!("NACKED ({})", t.last_nack),
        Some(t) if t.in_sync => format!("SYNCED ({})", t.resources),
        Some(t) => format!("STALE (sent {}, acked {})", t.sent_nonce, if t.acked_nonce.is_empty() { "none" } else { &t.acked_nonce }),
    }
}

/// The table (pure, for tests): one row per node proxy connection, and a
/// row for each node with none.
/// `-o json`: each replica's sync state, or its error (local and Kubernetes).
pub fn json(replies: &[(String, Result<Syncz, String>)]) -> anyhow::Result<()> {
    let v: Vec<serde_json::Value> = replies
        .iter()
        .map(|(name, r)| match r {
            Ok(s) => serde_json::to_value(s).unwrap_or_default(),
            Err(e) => serde_json::json!({"replica": name, "error": e}),
        })
        .collect();
    common::out(&format!("{}\n", serde_json::to_string_pretty(&v).context("encoding")?))
}

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
            last_nack_generation: 0,
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

/// Where one node stands with a change (pure, for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAck {
    /// Acknowledged everything up to the change.
    Acked,
    /// Not yet: why (not connected, the control plane not caught up, sent
    /// but not acknowledged).
    Waiting(String),
    /// It refused part of what it was sent: the reason it gave.
    Refused(String),
}

/// Whether each node's proxy acknowledged the resources made from objects
/// generation `want` (the agent's counter), judged from the replicas'
/// answers: a replica that took in `want` says which resource generation
/// it became, and a proxy connected to it that acknowledged that one holds
/// the change.
pub fn ack_state(nodes: &[String], want: u64, replies: &[(String, Result<Syncz, String>)]) -> Vec<(String, NodeAck)> {
    nodes
        .iter()
        .map(|n| {
            let mut why = format!("{n}: not connected to any control plane replica");
            for (replica, r) in replies {
                let Ok(s) = r else { continue };
                let Some(p) = s.proxies.iter().find(|p| &p.node == n) else { continue };
                if s.objects_generation < want {
                    why = format!("{n}: {replica} has not taken in the change yet (objects {} of {want})", s.objects_generation);
                    continue;
                }
                // A refusal of what this change produced (an older NACK,
                // whose resources have changed since, is not this one's).
                if let Some(t) = p.types.iter().find(|t| !t.last_nack.is_empty() && t.last_nack_generation >= s.generation) {
                    return (n.clone(), NodeAck::Refused(format!("{n} refused {} resources: {}", t.type_name, t.last_nack)));
                }
                if p.acked_generation >= s.generation {
                    return (n.clone(), NodeAck::Acked);
                }
                why = format!("{n}: sent generation {} by {replica}, acknowledged {}", s.generation, p.acked_generation);
            }
            (n.clone(), NodeAck::Waiting(why))
        })
        .collect()
}

/// Waits until every node proxy acknowledged the configuration made from
/// the objects as they are now (after `apply` or `delete`).
pub fn wait_acked(ctx: &Ctx, timeout: Duration) -> anyhow::Result<()> {
    wait_acked_with(ctx, timeout, false)
}

/// As [`wait_acked`], printing nothing on success (kubectl's verbs print
/// only kubectl's lines).
pub fn wait_acked_quietly(ctx: &Ctx, timeout: Duration) -> anyhow::Result<()> {
    wait_acked_with(ctx, timeout, true)
}

fn wait_acked_with(ctx: &Ctx, timeout: Duration, quiet: bool) -> anyhow::Result<()> {
    let st = ctx.status()?;
    if st.control.is_empty() || !st.agent.running {
        return Ok(());
    }
    let nodes: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let state = ack_state(&nodes, st.objects_generation, &fetch(ctx, &st));
        let refused: Vec<&str> =
            state.iter().filter_map(|(_, a)| if let NodeAck::Refused(r) = a { Some(r.as_str()) } else { None }).collect();
        if !refused.is_empty() {
            bail!(
                "node proxies refused the new configuration (they keep the previous version of what they refused):\n  {}",
                refused.join("\n  ")
            );
        }
        let waiting: Vec<&str> =
            state.iter().filter_map(|(_, a)| if let NodeAck::Waiting(w) = a { Some(w.as_str()) } else { None }).collect();
        if waiting.is_empty() {
            if quiet {
                return Ok(());
            }
            println!("configuration acknowledged by {} node prox{}", nodes.len(), if nodes.len() == 1 { "y" } else { "ies" });
            return Ok(());
        }
        if std::time::Instant::now() >= deadline || common::interrupted() {
            bail!(
                "the change is applied, but not every node proxy acknowledged it within {timeout:?} (see `slipstream proxy-status`):\n  {}",
                waiting.join("\n  ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod ack_tests {
    use super::*;

    fn reply(objects: u64, generation: u64, acked: &[(&str, u64)]) -> Result<Syncz, String> {
        Ok(Syncz {
            replica: "control1".into(),
            objects_generation: objects,
            generation,
            proxies: acked
                .iter()
                .map(|(n, g)| ProxySync {
                    node: n.to_string(),
                    acked_generation: *g,
                    types: vec![TypeSyncFixture::ok()],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    struct TypeSyncFixture;
    impl TypeSyncFixture {
        fn ok() -> slipstream_control::syncz::TypeSync {
            slipstream_control::syncz::TypeSync { type_name: "Address".into(), in_sync: true, ..Default::default() }
        }
    }

    #[test]
    fn acks() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        // Caught up and acknowledged by both.
        let s = ack_state(&nodes, 5, &[("control1".into(), reply(5, 9, &[("node1", 9), ("node2", 9)]))]);
        assert!(s.iter().all(|(_, a)| *a == NodeAck::Acked), "{s:?}");
        // The control plane has not read the change yet.
        let s = ack_state(&nodes, 6, &[("control1".into(), reply(5, 9, &[("node1", 9), ("node2", 9)]))]);
        assert!(matches!(&s[0].1, NodeAck::Waiting(w) if w.contains("has not taken in the change yet")), "{s:?}");
        // node2 lags; node1 is done.
        let s = ack_state(&nodes, 5, &[("control1".into(), reply(5, 9, &[("node1", 9), ("node2", 8)]))]);
        assert_eq!(s[0].1, NodeAck::Acked);
        assert_eq!(s[1].1, NodeAck::Waiting("node2: sent generation 9 by control1, acknowledged 8".into()));
        // Not connected at all, one replica down.
        let s = ack_state(&nodes, 5, &[("control1".into(), reply(5, 9, &[("node1", 9)])), ("control2".into(), Err("refused".into()))]);
        assert_eq!(s[1].1, NodeAck::Waiting("node2: not connected to any control plane replica".into()));
        // A NACK is a refusal, said at once.
        let mut r = reply(5, 9, &[("node1", 9), ("node2", 9)]).unwrap();
        r.proxies[1].types[0] = slipstream_control::syncz::TypeSync {
            type_name: "Address".into(),
            in_sync: false,
            last_nack: "workload x: addresses[0]: bad".into(),
            last_nack_generation: 9,
            ..Default::default()
        };
        let s = ack_state(&nodes, 5, &[("control1".into(), Ok(r.clone()))]);
        assert_eq!(s[1].1, NodeAck::Refused("node2 refused Address resources: workload x: addresses[0]: bad".into()));
        // An older NACK (of resources changed since) is not this change's refusal.
        r.proxies[1].types[0].last_nack_generation = 4;
        let s = ack_state(&nodes, 5, &[("control1".into(), Ok(r))]);
        assert_eq!(s[1].1, NodeAck::Acked);
    }
}
