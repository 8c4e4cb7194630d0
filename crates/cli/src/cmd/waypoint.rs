/// The waypoint's process: diagnostics and one access-log line per
/// request on stderr (the pod's log).
pub fn run(args: slipstream_waypoint::run::WaypointArgs) -> anyhow::Result<()> {
    slipstream_testbed::logging::init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(slipstream_waypoint::run::run(args))
}
