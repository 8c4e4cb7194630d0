use crate::common::Ctx;

/// The agent's process: logs go to stderr (redirected by `up` to agent.log),
/// repeated lines rate-limited.
pub fn run(ctx: &Ctx, nodes: usize, ca_cert: Option<std::path::PathBuf>, ca_key: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    slipstream_testbed::logging::init();
    // Pods share the machine's pid namespace: keep them out of our memory and /proc/PID/root.
    slipstream_testbed::sys::spawn::make_non_dumpable()?;
    slipstream_testbed::agent::run(slipstream_testbed::agent::AgentConfig { paths: ctx.paths.clone(), nodes, ca_cert, ca_key })
}
