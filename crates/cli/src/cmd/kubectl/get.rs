//! `get`: tables as kubectl prints them, `-o json|yaml|name|wide`,
//! `--watch`.

use super::kinds::Kind;
use super::select::{name_of, namespace_of, objects, select, status_condition, wanted, Scope};
use crate::common::{self, Ctx};
use anyhow::bail;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// One table row of `get`, with the pods' state from `status` (READY,
/// STATUS, RESTARTS as kubectl shows them).
fn row(k: &Kind, o: &Value, st: &slipstream_testbed::status::ClusterStatus, wide: bool) -> Vec<String> {
    let name = name_of(o).to_string();
    match k.kind {
        "Pod" => {
            let p = st.pods.iter().find(|p| p.namespace == namespace_of(o) && p.name == name);
            let ready =
                p.map(|p| format!("{}/{}", p.containers.iter().filter(|c| c.ready).count(), p.containers.len())).unwrap_or("0/0".into());
            let status = p
                .map(|p| if p.reason.is_empty() || p.ready { format!("{:?}", p.phase) } else { p.reason.clone() })
                .unwrap_or_else(|| o["status"]["phase"].as_str().unwrap_or("Unknown").to_string());
            let restarts = p.map(|p| p.restarts.to_string()).unwrap_or("0".into());
            let mut r = vec![name, ready, status, restarts];
            if wide {
                r.push(o["status"]["podIP"].as_str().unwrap_or("<none>").to_string());
                r.push(o["spec"]["nodeName"].as_str().unwrap_or("<none>").to_string());
            }
            r
        }
        "Service" => {
            let ports: Vec<String> = o["spec"]["ports"]
                .as_array()
                .map(|ps| ps.iter().map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"))).collect())
                .unwrap_or_default();
            let mut r = vec![
                name,
                o["spec"]["type"].as_str().unwrap_or("ClusterIP").to_string(),
                o["spec"]["clusterIP"].as_str().unwrap_or("<none>").to_string(),
                "<none>".into(),
                if ports.is_empty() { "<none>".into() } else { ports.join(",") },
            ];
            if wide {
                let sel: Vec<String> = o["spec"]["selector"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
                    .unwrap_or_default();
                r.push(if sel.is_empty() { "<none>".into() } else { sel.join(",") });
            }
            r
        }
        "Deployment" => {
            let s = &o["status"];
            vec![
                name,
                format!("{}/{}", s["readyReplicas"].as_u64().unwrap_or(0), o["spec"]["replicas"].as_u64().unwrap_or(0)),
                s["updatedReplicas"].as_u64().unwrap_or(0).to_string(),
                s["availableReplicas"].as_u64().unwrap_or(0).to_string(),
            ]
        }
        "Namespace" => vec![name, "Active".into()],
        "Gateway" => vec![
            name,
            o["spec"]["gatewayClassName"].as_str().unwrap_or("").to_string(),
            o["status"]["addresses"][0]["value"].as_str().unwrap_or("").to_string(),
            // kubectl's column: the Programmed condition, Unknown when no
            // controller wrote one (a class other than istio-waypoint).
            status_condition(o, "Programmed").map_or("Unknown", |c| if c { "True" } else { "False" }).to_string(),
        ],
        _ => vec![name],
    }
}

/// The table's header for a kind.
fn header(k: &Kind, wide: bool) -> Vec<&'static str> {
    let mut h = match k.kind {
        "Pod" => vec!["NAME", "READY", "STATUS", "RESTARTS"],
        "Service" => vec!["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"],
        "Deployment" => vec!["NAME", "READY", "UP-TO-DATE", "AVAILABLE"],
        "Namespace" => vec!["NAME", "STATUS"],
        "Gateway" => vec!["NAME", "CLASS", "ADDRESS", "PROGRAMMED"],
        _ => vec!["NAME"],
    };
    if wide {
        match k.kind {
            "Pod" => h.extend(["IP", "NODE"]),
            "Service" => h.push("SELECTOR"),
            _ => {}
        }
    }
    h
}

/// Columns padded as kubectl pads them (three spaces between).
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols).map(|i| rows.iter().filter_map(|r| r.get(i)).map(String::len).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i + 1 == r.len() {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<w$}   ", w = widths[i]));
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `get`'s arguments.
pub struct GetArgs<'a> {
    pub resources: &'a [String],
    pub scope: Scope,
    pub output: Option<&'a str>,
    pub watch: bool,
}

/// `get`: the objects asked for, printed as `output` says, once or
/// (`--watch`) until interrupted.
pub fn get(ctx: &Ctx, a: GetArgs) -> anyhow::Result<()> {
    let wanted = wanted(a.resources).map_err(anyhow::Error::msg)?;
    let output = a.output.unwrap_or("");
    if !["", "wide", "json", "yaml", "name"].contains(&output) {
        bail!("unable to match a printer suitable for the output format {output:?}, allowed formats are: json, name, wide, yaml");
    }
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut first = true;
    loop {
        let all = objects(ctx)?;
        let st = ctx.status()?;
        let mut found: Vec<(Kind, &Value)> = Vec::new();
        for w in &wanted {
            match select(&all, w, &a.scope) {
                Ok(v) => found.extend(v.into_iter().map(|o| (w.kind, o))),
                Err(e) => bail!("{e}"),
            }
        }
        let single = wanted.len() == 1 && wanted[0].names.len() == 1;
        match output {
            "json" | "yaml" => {
                let items: Vec<Value> = found.iter().map(|(_, o)| (*o).clone()).collect();
                let v = if single {
                    items.into_iter().next().unwrap_or_default()
                } else {
                    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
                };
                if output == "json" {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    print!("{}", serde_yaml::to_string(&v)?);
                }
            }
            "name" => {
                for (k, o) in &found {
                    println!("{}/{}", k.resource, name_of(o));
                }
            }
            _ => {
                let wide = output == "wide";
                if found.is_empty() && first {
                    match (&a.scope.all, wanted.iter().all(|w| w.kind.namespaced)) {
                        (false, true) => eprintln!("No resources found in {} namespace.", a.scope.ns()),
                        _ => eprintln!("No resources found"),
                    }
                }
                // One table per kind, as kubectl prints several kinds.
                let mut blocks = Vec::new();
                for w in &wanted {
                    let mine: Vec<&Value> = found.iter().filter(|(k, _)| *k == w.kind).map(|(_, o)| *o).collect();
                    if mine.is_empty() {
                        continue;
                    }
                    let prefix = wanted.len() > 1;
                    let mut rows = Vec::new();
                    let mut head: Vec<String> = header(&w.kind, wide).into_iter().map(String::from).collect();
                    if a.scope.all && w.kind.namespaced {
                        head.insert(0, "NAMESPACE".into());
                    }
                    rows.push(head);
                    for o in mine {
                        let mut r = row(&w.kind, o, &st, wide);
                        if prefix {
                            r[0] = format!("{}/{}", w.kind.resource, r[0]);
                        }
                        if a.scope.all && w.kind.namespaced {
                            r.insert(0, namespace_of(o).to_string());
                        }
                        let key = format!("{}/{}/{}", w.kind.kind, namespace_of(o), name_of(o));
                        let line = r.join("\u{1}");
                        if !first && shown.get(&key) == Some(&line) {
                            continue;
                        }
                        shown.insert(key, line);
                        rows.push(r);
                    }
                    if first {
                        blocks.push(table(&rows));
                    } else if rows.len() > 1 {
                        // Watching: a changed row, without the header.
                        let t = table(&rows);
                        blocks.push(t.split_once('\n').map(|(_, rows)| rows.to_string()).unwrap_or_default());
                    }
                }
                if !blocks.is_empty() {
                    println!("{}", blocks.join("\n\n"));
                }
            }
        }
        if !a.watch || common::interrupted() {
            return Ok(());
        }
        first = false;
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn tables_are_padded_as_kubectl_pads_them() {
        let t = table(&[s(&["NAME", "READY"]), s(&["a-long-name", "1/1"])]);
        assert_eq!(t, "NAME          READY\na-long-name   1/1");
    }
}
