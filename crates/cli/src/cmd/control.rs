/// The control plane's process. Diagnostics go to stderr; `up` sends them
/// to /run/slipstream/<cluster>/control/control<N>.log.
pub fn run(args: slipstream_control::run::ControlArgs) -> anyhow::Result<()> {
    slipstream_proxy::process::init();
    // It holds the CA's signing key: no other process may read its memory.
    slipstream_proxy::process::make_non_dumpable()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(slipstream_control::run::run(args))
}
