//! `x waypoint apply|list|status|delete` (`istioctl waypoint`) on
//! Kubernetes: the Gateway of class `istio-waypoint` created, listed and
//! deleted through the API server; its `Programmed` condition is the
//! control plane's gateway controller's (the elected replica's).

use super::reach::{self, Kube};
use super::target::KubeTarget;
use crate::cmd::istioctl::{self, WaypointCommand, XCommand};
use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::Value;
use std::time::{Duration, Instant};

fn gateways(k: &Kube, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"), "gateways");
    match namespace {
        Some(ns) => Api::namespaced_with(k.client.clone(), ns, &ar),
        None => Api::all_with(k.client.clone(), &ar),
    }
}

/// The waypoints among `objects` (pure), as JSON.
fn waypoints(objects: Vec<DynamicObject>) -> Vec<Value> {
    objects.into_iter().filter_map(|o| serde_json::to_value(o).ok()).filter(|o| o["spec"]["gatewayClassName"] == "istio-waypoint").collect()
}

/// `x waypoint ...` on Kubernetes.
pub fn run(t: &KubeTarget, x: XCommand) -> anyhow::Result<()> {
    let XCommand::Waypoint(cmd) = x;
    reach::block_on(async {
        let k = reach::connect(t).await?;
        match cmd {
            WaypointCommand::Apply { namespace, name, for_, enroll_namespace, overwrite, timeout } => {
                apply(&k, &namespace, &name, &for_, overwrite, timeout).await?;
                if enroll_namespace {
                    let patch = serde_json::json!({"metadata": {"labels": {"istio.io/use-waypoint": name}}});
                    Api::<Namespace>::all(k.client.clone()).patch(&namespace, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    println!("namespace {namespace} labeled with \"istio.io/use-waypoint: {name}\"");
                }
                Ok(())
            }
            WaypointCommand::List { namespace, all_namespaces } => list(&k, &namespace, all_namespaces).await,
            WaypointCommand::Status { namespace, name } => status(&k, &namespace, &name).await,
            WaypointCommand::Delete { names, namespace, all } => delete(&k, names, &namespace, all).await,
        }
    })
}

async fn apply(k: &Kube, namespace: &str, name: &str, for_: &str, overwrite: bool, timeout: Duration) -> anyhow::Result<()> {
    let gw = istioctl::gateway(namespace, name, for_).map_err(anyhow::Error::msg)?;
    if Api::<Namespace>::all(k.client.clone()).get_opt(namespace).await?.is_none() {
        bail!("namespace {namespace:?} not found");
    }
    let api = gateways(k, Some(namespace));
    let object: DynamicObject = serde_json::from_value(gw.clone())?;
    match api.get_opt(name).await? {
        Some(_) if !overwrite => bail!("waypoint {namespace}/{name} already exists (use --overwrite to replace it)"),
        Some(_) => {
            let pp = PatchParams::apply("slipstream-istioctl").force();
            api.patch(name, &pp, &Patch::Apply(&gw)).await.with_context(|| format!("replacing Gateway {namespace}/{name}"))?;
        }
        None => {
            api.create(&PostParams::default(), &object).await.with_context(|| format!("creating Gateway {namespace}/{name}"))?;
        }
    }
    // As istioctl: the waypoint is there once the controller programmed it.
    let deadline = Instant::now() + timeout;
    loop {
        let now = api.get_opt(name).await?.and_then(|o| serde_json::to_value(o).ok());
        if now.as_ref().is_some_and(istioctl::programmed) {
            println!("waypoint {namespace}/{name} applied");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("waypoint {namespace}/{name} created, but not programmed within {timeout:?} (no ready waypoint pod yet: see `kubectl -n {namespace} get gateway {name} -o yaml`)");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn list(k: &Kube, namespace: &str, all_namespaces: bool) -> anyhow::Result<()> {
    let api = gateways(k, if all_namespaces { None } else { Some(namespace) });
    let ws = waypoints(api.list(&ListParams::default()).await.context("listing Gateways")?.items);
    let mut rows = vec![vec!["NAME".to_string(), "REVISION".into(), "PROGRAMMED".into()]];
    if all_namespaces {
        rows[0].insert(0, "NAMESPACE".into());
    }
    for w in &ws {
        let mut r = vec![
            w["metadata"]["name"].as_str().unwrap_or("").to_string(),
            "default".into(),
            if istioctl::programmed(w) { "True" } else { "False" }.into(),
        ];
        if all_namespaces {
            r.insert(0, w["metadata"]["namespace"].as_str().unwrap_or("").to_string());
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

async fn status(k: &Kube, namespace: &str, name: &str) -> anyhow::Result<()> {
    let Some(w) = gateways(k, Some(namespace)).get_opt(name).await?.and_then(|o| serde_json::to_value(o).ok()) else {
        bail!("waypoint {namespace}/{name} not found");
    };
    let services: Vec<serde_json::Value> = Api::<Service>::all(k.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|s| serde_json::to_value(s).ok())
        .collect();
    println!("{}", istioctl::status_table(namespace, name, &w, &services));
    Ok(())
}

async fn delete(k: &Kube, names: Vec<String>, namespace: &str, all: bool) -> anyhow::Result<()> {
    let api = gateways(k, Some(namespace));
    let names: Vec<String> = if all {
        waypoints(api.list(&ListParams::default()).await?.items)
            .iter()
            .filter_map(|w| w["metadata"]["name"].as_str().map(String::from))
            .collect()
    } else if names.is_empty() {
        vec!["waypoint".into()]
    } else {
        names
    };
    for n in &names {
        api.delete(n, &DeleteParams::default()).await.with_context(|| format!("deleting waypoint {namespace}/{n}"))?;
        println!("waypoint {namespace}/{n} deleted");
    }
    Ok(())
}
