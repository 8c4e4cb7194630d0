use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::ipc::Request;
use slipstream_testbed::sweep;
use slipstream_testbed::sys::signals;
use std::time::{Duration, Instant};

pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    common::require_root("down")?;
    let paths = &ctx.paths;
    let left = sweep::find(paths);
    if left.is_empty() {
        println!("cluster {:?}: nothing to remove", paths.cluster.as_str());
        return Ok(());
    }
    // Graceful first: the agent stops pods with their grace period.
    if let Some(pid) = left.agent {
        println!("stopping cluster {:?} (agent pid {pid})", paths.cluster.as_str());
        if ctx.call(&Request::Shutdown, Duration::from_secs(5)).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while signals::alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Then sweep by name, whatever the agent managed to do.
    let problems = sweep::sweep(paths);
    let after = sweep::find(paths);
    if !problems.is_empty() || !after.is_empty() {
        bail!("some of cluster {:?} could not be removed ({}):\n{}", paths.cluster.as_str(), after.describe(), problems.join("\n"));
    }
    println!("cluster {:?} removed ({})", paths.cluster.as_str(), left.describe());
    Ok(())
}
