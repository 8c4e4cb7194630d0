use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::ipc::{Request, Response};
use std::path::PathBuf;
use std::time::Duration;

pub fn apply(ctx: &Ctx, files: &[PathBuf], selector: Option<&str>, wait: bool, timeout: Duration) -> anyhow::Result<()> {
    common::require_root("apply")?;
    let mut objects: Vec<_> = common::load(files)?.into_iter().map(|l| l.object).collect();
    // kubectl's `-l`: only the objects whose labels match.
    if let Some(sel) = selector {
        let sel = crate::cmd::kubectl::Selector::parse(sel).map_err(anyhow::Error::msg)?;
        objects.retain(|o| sel.matches(&o.metadata().labels));
        if objects.is_empty() {
            bail!("no objects passed to apply (none matches the selector); nothing was changed");
        }
    }
    let scope = common::Scope::of(&objects);
    send(ctx, Request::Apply { objects })?;
    if wait {
        let started = std::time::Instant::now();
        common::wait_converged(ctx, timeout, false, &scope)?;
        crate::cmd::proxy_status::wait_acked(ctx, timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(5)))?;
    }
    Ok(())
}

pub fn delete(ctx: &Ctx, files: &[PathBuf], ignore_not_found: bool, wait: bool, timeout: Duration) -> anyhow::Result<()> {
    common::require_root("delete")?;
    let objects: Vec<_> = common::load(files)?.into_iter().map(|l| l.object).collect();
    let keys: Vec<_> = objects.iter().map(|o| o.key()).collect();
    let scope = common::Scope::of(&objects);
    send(ctx, Request::Delete { keys, ignore_not_found })?;
    if wait {
        let started = std::time::Instant::now();
        common::wait_converged(ctx, timeout, true, &scope)?;
        crate::cmd::proxy_status::wait_acked(ctx, timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(5)))?;
    }
    Ok(())
}

fn send(ctx: &Ctx, req: Request) -> anyhow::Result<()> {
    match ctx.call(&req, Duration::from_secs(120))? {
        Response::Done { lines } => {
            lines.iter().for_each(|l| println!("{l}"));
            Ok(())
        }
        Response::Rejected { errors } => bail!("rejected, nothing was changed:\n{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}
