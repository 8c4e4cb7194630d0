use crate::common::{self, Ctx};
use slipstream_testbed::cluster::{Cluster, Io, Removed};

pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    common::require_root("down")?;
    let cluster = ctx.paths.cluster.as_str();
    let io = Io { interrupted: &|| false, say: &|l| println!("{l}"), warn: &|l| eprintln!("{l}") };
    match Cluster::down(&ctx.paths, &io)? {
        Removed::Nothing => println!("cluster {cluster:?}: nothing to remove"),
        Removed::Cluster(what) => println!("cluster {cluster:?} removed ({what})"),
    }
    Ok(())
}
