/// The waypoint's process: diagnostics and one access-log line per
/// request on stderr (the pod's log).
pub fn run(args: slipstream_waypoint::run::WaypointArgs) -> anyhow::Result<()> {
    slipstream_proxy::process::init_with_writer(slipstream_waypoint::logbuf::Writer);
    // Lines gathered for the scheduler's pass are written before a panic's
    // message, and on exit.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        slipstream_waypoint::logbuf::flush();
        previous(info);
    }));
    // It holds its identity's private key, and requests' contents pass
    // through its memory: no other process of the machine without
    // CAP_SYS_PTRACE reads /proc/PID/mem of it, and no core dump holds it,
    // as for the node proxy.
    slipstream_proxy::process::make_non_dumpable()?;
    // glibc's malloc still serves the TLS library's allocations: the
    // proxies' shared tuning (Rust's own allocations go to mimalloc).
    slipstream_proxy::sys::mem::tune_allocator();
    let rt = if args.workers == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(usize::from(args.workers)).enable_all().build()?
    };
    let result = rt.block_on(async {
        tokio::spawn(slipstream_waypoint::logbuf::flusher());
        slipstream_waypoint::run::run(args).await
    });
    slipstream_waypoint::logbuf::flush();
    result
}
