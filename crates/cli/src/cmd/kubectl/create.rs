//! `create namespace`.

use super::select::{name_of, objects};
use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::ipc::{Request, Response};
use std::time::Duration;

/// `create namespace NAME`, refused as the API server refuses an existing
/// one or an invalid name.
pub fn create_namespace(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    common::require_root("create")?;
    slipstream_k8s::names::check_dns_label(name).map_err(|e| anyhow::anyhow!("The Namespace \"{name}\" is invalid: metadata.name: {e}"))?;
    let all = objects(ctx)?;
    if all.iter().any(|o| o["kind"] == "Namespace" && name_of(o) == name) {
        bail!("Error from server (AlreadyExists): namespaces \"{name}\" already exists");
    }
    let o: slipstream_k8s::Object =
        serde_json::from_value(serde_json::json!({"Namespace": {"metadata": {"name": name}}})).expect("a namespace object");
    match ctx.call(&Request::Apply { objects: vec![o] }, Duration::from_secs(30))? {
        Response::Done { .. } => println!("namespace/{name} created"),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    Ok(())
}
