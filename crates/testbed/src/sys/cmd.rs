//! Running the system tools the cluster is built with (`ip`, `nft`), with
//! errors that show the command and what it printed.

use std::io::Write;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
#[error("`{cmd}` failed: {detail}")]
pub struct CmdError {
    pub cmd: String,
    pub detail: String,
}

/// Runs `argv`, feeding `stdin` if given; Ok(stdout) on exit status 0.
pub fn run(argv: &[&str], stdin: Option<&str>) -> Result<String, CmdError> {
    let shown = argv.join(" ");
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = c.spawn().map_err(|e| CmdError {
        cmd: shown.clone(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            format!("{} is not installed (run scripts/setup.sh)", argv[0])
        } else {
            e.to_string()
        },
    })?;
    if let Some(input) = stdin {
        if let Some(mut si) = child.stdin.take() {
            let _ = si.write_all(input.as_bytes());
        }
    }
    let out = child.wait_with_output().map_err(|e| CmdError { cmd: shown.clone(), detail: e.to_string() })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).take(6).collect();
        Err(CmdError {
            cmd: if stdin.is_some() { format!("{shown} <<{}", stdin.unwrap_or("").lines().next().unwrap_or("")) } else { shown },
            detail: format!("{} ({})", first.join("; "), out.status),
        })
    }
}

/// Runs several `ip` commands inside one network namespace with one process.
pub fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), CmdError> {
    let mut argv = vec!["ip"];
    if let Some(ns) = netns {
        argv.extend(["-n", ns]);
    }
    argv.extend(["-batch", "-"]);
    run(&argv, Some(&(lines.join("\n") + "\n"))).map(|_| ())
}
