//! `slipstream debug`: the data-path tools of slipstream-node's `debug`
//! module, with the cluster's CA as the default.

use crate::common::Ctx;
use clap::Subcommand;
use slipstream_node::debug::{self, HboneArgs, HoldArgs, TcpArgs};

#[derive(Subcommand)]
pub enum DebugCommand {
    /// One HBONE CONNECT as any identity to any address: prints the answer
    /// and the bytes that came back; fails with the error and its response
    /// flag. Run it in a pod (`slipstream exec POD -- slipstream debug
    /// hbone ...`) or a node's namespace.
    Hbone(HboneArgs),
    /// One plain TCP exchange: send, half-close, read first, or write
    /// without reading.
    Tcp(TcpArgs),
    /// Hold many echo connections open at once.
    Hold(HoldArgs),
}

pub fn run(ctx: &Ctx, cmd: DebugCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match cmd {
        DebugCommand::Hbone(mut a) => {
            // The cluster's own CA unless told otherwise.
            let ca = ctx.paths.ca_dir();
            if a.ca_cert.is_none() {
                a.ca_cert = Some(ca.join("root-cert.pem"));
            }
            if a.ca_key.is_none() && !a.self_signed_ca {
                a.ca_key = Some(ca.join("root-key.pem"));
            }
            rt.block_on(debug::hbone::run(a))
        }
        DebugCommand::Tcp(a) => rt.block_on(debug::tcp::run(a)),
        DebugCommand::Hold(a) => rt.block_on(debug::hold::run(a)),
    }
}
