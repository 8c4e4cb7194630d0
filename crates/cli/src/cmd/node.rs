use crate::common::Ctx;

/// The node proxy's process. Diagnostics go to stderr, access logs to
/// stdout; `up` sends both to /run/slipstream/<cluster>/nodes/<node>.log.
pub fn run(ctx: &Ctx, args: slipstream_node::NodeArgs) -> anyhow::Result<()> {
    // Diagnostics only: access-log lines are printed, never rate-limited.
    slipstream_testbed::logging::init();
    // Pods share the machine's pid namespace: keep them out of our memory and /proc/PID/root.
    slipstream_testbed::sys::spawn::make_non_dumpable()?;
    slipstream_node::sys::mem::tune_allocator();
    let workers = usize::from(args.workers);
    let config = slipstream_node::Config::from_args(ctx.paths.cluster.as_str(), args);
    let rt = if workers == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?
    };
    rt.block_on(slipstream_node::proxy::run(config))
}
