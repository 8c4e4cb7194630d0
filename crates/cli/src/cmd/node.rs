/// The node proxy's process. Diagnostics go to stderr, access logs to
/// stdout; `up` sends both to /run/slipstream/<cluster>/nodes/<node>.log.
pub fn run(cluster: &str, args: slipstream_node::NodeArgs) -> anyhow::Result<()> {
    // Diagnostics only: access-log lines are printed, never rate-limited.
    slipstream_proxy::process::init();
    // It holds the mesh's keys. Confined pods cannot see it (their own PID
    // namespace), but privileged ones and any root process of the machine
    // without CAP_SYS_PTRACE must not read its memory or its
    // /proc/PID/{mem,root,fd,environ} either, and no core dump may hold them.
    slipstream_proxy::process::make_non_dumpable()?;
    slipstream_proxy::sys::mem::tune_allocator();
    let workers = usize::from(args.workers);
    let config = slipstream_node::Config::from_args(cluster, args);
    // Every thread runs its own single-threaded runtime: this one (control
    // plane, admin, accepting) and one more per further worker, each serving
    // the connections handed to it with its own pooled HBONE connections
    // (docs/node-proxy.md, "Threads").
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    slipstream_node::shard::start(workers)?;
    rt.block_on(slipstream_node::proxy::run(config))
}
