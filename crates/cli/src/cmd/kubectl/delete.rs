//! `delete KIND NAME`.

use super::select::wanted;
use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::ipc::{Request, Response};
use std::time::Duration;

/// `delete KIND NAME...` (or `KIND/NAME`), waiting for their pods to stop
/// as `delete -f` does.
pub fn delete(ctx: &Ctx, resources: &[String], namespace: Option<&str>, ignore_not_found: bool, timeout: Duration) -> anyhow::Result<()> {
    common::require_root("delete")?;
    let wanted = wanted(resources).map_err(anyhow::Error::msg)?;
    if wanted.iter().any(|w| w.names.is_empty()) {
        bail!("resource(s) were provided, but no name was specified (give names, or use -f)");
    }
    let ns = namespace.unwrap_or("default");
    let keys: Vec<slipstream_k8s::ObjectKey> = wanted
        .iter()
        .flat_map(|w| {
            w.names.iter().map(|n| slipstream_k8s::ObjectKey {
                kind: w.kind.kind.to_string(),
                namespace: if w.kind.namespaced { ns.to_string() } else { String::new() },
                name: n.clone(),
            })
        })
        .collect();
    match ctx.call(&Request::Delete { keys: keys.clone(), ignore_not_found }, Duration::from_secs(120))? {
        Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    common::wait_converged(ctx, timeout, true, &common::Scope::Objects(keys))?;
    Ok(())
}
