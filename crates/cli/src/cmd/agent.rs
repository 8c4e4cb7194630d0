use crate::common::Ctx;

/// The agent's process: logs go to stderr (redirected by `up` to agent.log).
pub fn run(ctx: &Ctx, nodes: usize, ca_cert: Option<std::path::PathBuf>, ca_key: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLIPSTREAM_LOG").unwrap_or_else(|_| "info".into()))
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    slipstream_testbed::agent::run(slipstream_testbed::agent::AgentConfig { paths: ctx.paths.clone(), nodes, ca_cert, ca_key })
}
