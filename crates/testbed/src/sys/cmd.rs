//! Running the system tools the cluster is built with (`ip`, `nft`), with
//! errors that show the command and what it printed.

// One runner for the system tools, the product's (`slipstream_cni::cmd`):
// its errors show the command and what it printed.
pub use slipstream_cni::cmd::{run, CmdError};

/// Runs several `ip` commands inside one network namespace with one process.
pub fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), CmdError> {
    let mut argv = vec!["ip"];
    if let Some(ns) = netns {
        argv.extend(["-n", ns]);
    }
    argv.extend(["-batch", "-"]);
    run(&argv, Some(&(lines.join("\n") + "\n"))).map(|_| ())
}
