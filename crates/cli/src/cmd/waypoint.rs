/// The waypoint's process: diagnostics and one access-log line per
/// request on stderr (the pod's log).
pub fn run(args: slipstream_waypoint::run::WaypointArgs) -> anyhow::Result<()> {
    slipstream_testbed::logging::init();
    // It holds its identity's private key, and requests' contents pass
    // through its memory: no other process of the machine without
    // CAP_SYS_PTRACE reads /proc/PID/mem of it, and no core dump holds it,
    // as for the node proxy.
    slipstream_testbed::sys::spawn::make_non_dumpable()?;
    // Bodies pass through in frames of up to 1 MiB: kept in the heap
    // rather than mapped and unmapped for each (the node proxy's tuning).
    slipstream_node::sys::mem::tune_allocator();
    let rt = if args.workers == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(usize::from(args.workers)).enable_all().build()?
    };
    rt.block_on(slipstream_waypoint::run::run(args))
}
