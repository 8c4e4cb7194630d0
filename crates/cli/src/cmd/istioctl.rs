//! istioctl's habits on the local cluster (issue 17): `x waypoint
//! apply|list|status|delete`, which make and inspect the Gateway of class
//! `istio-waypoint` as istioctl does. (`proxy-status` and `ztunnel-config`
//! are `cmd::proxy_status` and `cmd::proxy_config`.)

use crate::common::{self, Ctx};
use anyhow::bail;
use serde_json::Value;
use slipstream_testbed::ipc::{Request, Response};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum XCommand {
    /// istioctl's waypoint commands (also `istioctl waypoint ...` when
    /// slipstream runs under the name istioctl).
    #[command(subcommand)]
    Waypoint(WaypointCommand),
}

#[derive(clap::Subcommand)]
pub enum WaypointCommand {
    /// Create (or update) a waypoint: a Gateway of class istio-waypoint
    /// with its HBONE listener on 15008, and wait until its pod is ready.
    Apply {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        /// The Gateway's name.
        #[arg(long, default_value = "waypoint")]
        name: String,
        /// What traffic it takes: service, workload, all or none.
        #[arg(long = "for", default_value = "service")]
        for_: String,
        /// Also label the namespace istio.io/use-waypoint=NAME (every
        /// service of it then goes through the waypoint).
        #[arg(long)]
        enroll_namespace: bool,
        /// Replace a waypoint of that name that exists.
        #[arg(long)]
        overwrite: bool,
        #[arg(long, default_value = "120s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
    },
    /// The waypoints of a namespace (or all with -A).
    List {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        #[arg(short = 'A', long = "all-namespaces")]
        all_namespaces: bool,
    },
    /// Whether a waypoint is programmed (its pod ready), and what is bound to it.
    Status {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        #[arg(long, default_value = "waypoint")]
        name: String,
    },
    /// Delete waypoints by name (or --all in the namespace).
    Delete {
        names: Vec<String>,
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        #[arg(long)]
        all: bool,
    },
}

/// The Gateway istioctl makes for `waypoint apply`.
pub fn gateway(namespace: &str, name: &str, for_: &str) -> Result<Value, String> {
    if !["service", "workload", "all", "none"].contains(&for_) {
        return Err(format!("--for {for_:?}: use service, workload, all or none"));
    }
    Ok(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": {"istio.io/waypoint-for": for_}},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }))
}

fn objects(ctx: &Ctx) -> anyhow::Result<Vec<Value>> {
    match ctx.call(&Request::Objects, Duration::from_secs(10))? {
        Response::Objects { items } => Ok(items),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

fn waypoints(all: &[Value]) -> impl Iterator<Item = &Value> {
    all.iter().filter(|o| o["kind"] == "Gateway" && o["spec"]["gatewayClassName"] == "istio-waypoint")
}

/// The Gateway's `Programmed` condition, which the agent writes once a pod
/// of the waypoint is ready (`control::gateway::status`).
pub fn programmed(gateway: &Value) -> bool {
    condition_true(gateway, "Programmed", None)
}

/// `o` has a condition of this type that says exactly `message`.
pub fn has_condition_message(o: &Value, type_: &str, message: &str) -> bool {
    o["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["message"] == message))
}

/// `o` has a condition of this type that is `True` (and, when given, says
/// exactly `message`).
pub fn condition_true(o: &Value, type_: &str, message: Option<&str>) -> bool {
    o["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True" && message.is_none_or(|m| c["message"] == m)))
}

pub fn run(ctx: &Ctx, cmd: XCommand) -> anyhow::Result<()> {
    let XCommand::Waypoint(cmd) = cmd;
    match cmd {
        WaypointCommand::Apply { namespace, name, for_, enroll_namespace, overwrite, timeout } => {
            apply(ctx, namespace, name, &for_, enroll_namespace, overwrite, timeout)
        }
        WaypointCommand::List { namespace, all_namespaces } => list(ctx, &namespace, all_namespaces),
        WaypointCommand::Status { namespace, name } => status(ctx, namespace, name),
        WaypointCommand::Delete { names, namespace, all } => delete(ctx, names, namespace, all),
    }
}

/// `x waypoint apply`: the Gateway applied, its pod ready, and (with
/// `--enroll-namespace`) the namespace labeled to use it.
fn apply(
    ctx: &Ctx,
    namespace: String,
    name: String,
    for_: &str,
    enroll_namespace: bool,
    overwrite: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    common::require_root("x waypoint apply")?;
    let gw = gateway(&namespace, &name, for_).map_err(anyhow::Error::msg)?;
    let all = objects(ctx)?;
    if !all.iter().any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == namespace.as_str()) {
        bail!("namespace {namespace:?} not found");
    }
    if waypoints(&all).any(|o| o["metadata"]["name"] == name.as_str() && o["metadata"]["namespace"] == namespace.as_str()) && !overwrite {
        bail!("waypoint {namespace}/{name} already exists (use --overwrite to replace it)");
    }
    let object: slipstream_k8s::Object = slipstream_k8s::load_str(&serde_json::to_string(&gw)?, &slipstream_k8s::Source("istioctl".into()))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .remove(0)
        .object;
    match ctx.call(&Request::Apply { objects: vec![object.clone()] }, Duration::from_secs(30))? {
        Response::Done { .. } => {}
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    common::wait_converged(ctx, timeout, true, &common::Scope::of(&[object]))?;
    println!("waypoint {namespace}/{name} applied");
    if enroll_namespace {
        enroll(ctx, &namespace, &name)?;
    }
    crate::cmd::proxy_status::wait_acked_quietly(ctx, Duration::from_secs(30))
}

/// `--enroll-namespace`: the namespace labeled `istio.io/use-waypoint=NAME`.
fn enroll(ctx: &Ctx, namespace: &str, name: &str) -> anyhow::Result<()> {
    let req = Request::Label {
        kind: "Namespace".into(),
        namespace: String::new(),
        name: namespace.to_string(),
        changes: vec![("istio.io/use-waypoint".into(), Some(name.to_string()))],
        overwrite: true,
        annotate: false,
    };
    match ctx.call(&req, Duration::from_secs(30))? {
        Response::Done { .. } => println!("namespace {namespace} labeled with \"istio.io/use-waypoint: {name}\""),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    Ok(())
}

/// `x waypoint list`.
fn list(ctx: &Ctx, namespace: &str, all_namespaces: bool) -> anyhow::Result<()> {
    let all = objects(ctx)?;
    let mut rows = vec![vec!["NAME".to_string(), "REVISION".into(), "PROGRAMMED".into()]];
    if all_namespaces {
        rows[0].insert(0, "NAMESPACE".into());
    }
    for w in waypoints(&all).filter(|w| all_namespaces || w["metadata"]["namespace"] == namespace) {
        let (ns, n) = (w["metadata"]["namespace"].as_str().unwrap_or(""), w["metadata"]["name"].as_str().unwrap_or(""));
        let mut r = vec![n.to_string(), "default".into(), if programmed(w) { "True" } else { "False" }.into()];
        if all_namespaces {
            r.insert(0, ns.to_string());
        }
        rows.push(r);
    }
    if rows.len() == 1 {
        println!("No waypoints found.");
    } else {
        println!("{}", crate::cmd::kubectl::table(&rows));
    }
    Ok(())
}

/// `x waypoint status`: whether it is programmed, and the services bound
/// to it (or waiting for it).
fn status(ctx: &Ctx, namespace: String, name: String) -> anyhow::Result<()> {
    let all = objects(ctx)?;
    let Some(w) = waypoints(&all).find(|w| w["metadata"]["name"] == name.as_str() && w["metadata"]["namespace"] == namespace.as_str())
    else {
        bail!("waypoint {namespace}/{name} not found");
    };
    println!("{}", status_table(&namespace, &name, w, all.iter().filter(|o| o["kind"] == "Service")));
    Ok(())
}

/// `x waypoint status`'s table, here and on Kubernetes: waypoint `w`,
/// whether it is programmed, and which of `services` are bound to it or
/// waiting for it, as their istio.io/WaypointBound condition says (the
/// control plane's binding, every label and rule of it).
pub fn status_table<'a>(
    namespace: &str,
    name: &str,
    w: &serde_json::Value,
    services: impl IntoIterator<Item = &'a serde_json::Value>,
) -> String {
    use slipstream_control::gateway::status as st;
    let bound = st::bound_message(namespace, name);
    let waiting = st::refused_message(namespace, name, &slipstream_control::translate::waypoint::NotBound::NotReady);
    let services: Vec<String> = services
        .into_iter()
        .filter(|o| condition_true(o, st::WAYPOINT_BOUND, Some(&bound)) || has_condition_message(o, st::WAYPOINT_BOUND, &waiting))
        .map(|o| {
            let (ns, n) = (o["metadata"]["namespace"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or(""));
            if ns == namespace {
                n.to_string()
            } else {
                format!("{ns}/{n}")
            }
        })
        .collect();
    let rows = vec![
        vec!["NAMESPACE".to_string(), "NAME".into(), "FOR".into(), "STATUS".into(), "BOUND SERVICES".into()],
        vec![
            namespace.to_string(),
            name.to_string(),
            w["metadata"]["labels"]["istio.io/waypoint-for"].as_str().unwrap_or("service").to_string(),
            if programmed(w) { "Programmed" } else { "NotProgrammed (no ready pod)" }.into(),
            if services.is_empty() { "<none>".into() } else { services.join(",") },
        ],
    ];
    crate::cmd::kubectl::table(&rows)
}

/// `x waypoint delete`: by name, or `--all` of the namespace.
fn delete(ctx: &Ctx, names: Vec<String>, namespace: String, all: bool) -> anyhow::Result<()> {
    common::require_root("x waypoint delete")?;
    let existing = objects(ctx)?;
    let names: Vec<String> = if all {
        waypoints(&existing)
            .filter(|w| w["metadata"]["namespace"] == namespace.as_str())
            .filter_map(|w| w["metadata"]["name"].as_str().map(String::from))
            .collect()
    } else if names.is_empty() {
        vec!["waypoint".into()]
    } else {
        names
    };
    let keys: Vec<slipstream_k8s::ObjectKey> =
        names.iter().map(|n| slipstream_k8s::ObjectKey { kind: "Gateway".into(), namespace: namespace.clone(), name: n.clone() }).collect();
    match ctx.call(&Request::Delete { keys: keys.clone(), ignore_not_found: false }, Duration::from_secs(60))? {
        Response::Done { .. } => names.iter().for_each(|n| println!("waypoint {namespace}/{n} deleted")),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gateway_istioctl_makes() {
        let g = super::gateway("bookinfo", "waypoint", "service").unwrap();
        assert_eq!(g["spec"]["gatewayClassName"], "istio-waypoint");
        assert_eq!(g["spec"]["listeners"][0]["port"], 15008);
        assert_eq!(g["spec"]["listeners"][0]["protocol"], "HBONE");
        assert_eq!(g["metadata"]["labels"]["istio.io/waypoint-for"], "service");
        // It loads as any applied Gateway does.
        let y = serde_json::to_string(&g).unwrap();
        assert!(slipstream_k8s::load_str(&y, &slipstream_k8s::Source("t".into())).is_ok());
        assert!(super::gateway("bookinfo", "waypoint", "everything").is_err());
    }
}
