use crate::common::Ctx;

/// The agent's process: logs go to stderr (redirected by `up` to agent.log),
/// repeated lines rate-limited.
pub fn run(
    ctx: &Ctx,
    nodes: usize,
    control_replicas: usize,
    datapath: slipstream_testbed::agent::datapath::Mode,
    ca_cert: Option<std::path::PathBuf>,
    ca_key: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    slipstream_testbed::logging::init();
    // It holds the mesh's keys. Confined pods cannot see it (their own PID
    // namespace), but privileged ones and any root process of the machine
    // without CAP_SYS_PTRACE must not read its memory or its
    // /proc/PID/{mem,root,fd,environ} either, and no core dump may hold them.
    slipstream_testbed::sys::spawn::make_non_dumpable()?;
    slipstream_testbed::agent::run(slipstream_testbed::agent::AgentConfig {
        paths: ctx.paths.clone(),
        nodes,
        ca_cert,
        ca_key,
        control_replicas,
        datapath,
    })
}
