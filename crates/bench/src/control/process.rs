//! The control plane under test: `slipstream control` as a process of its
//! own (this binary, `current_exe`), so that its memory is its own. Stopped
//! when the handle is dropped, on error paths too.

use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where everything the control plane reads lives.
#[derive(Debug, Clone)]
pub struct ControlFiles {
    pub objects: PathBuf,
    pub node_tokens: PathBuf,
    pub ca_dir: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
}

pub struct ControlProcess {
    child: Option<Child>,
    pub pid: u32,
    pub xds: SocketAddr,
    pub monitor: SocketAddr,
}

/// A loopback port free now (the kernel's choice; it is released for the
/// control plane to bind a moment later).
fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(l.local_addr()?)
}

/// Memory of a process, from /proc/PID/status.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Memory {
    /// VmRSS, MB (2^20 bytes, as the rest of the report).
    pub rss_mb: f64,
    /// VmHWM (the peak of RSS), MB.
    pub peak_mb: f64,
}

/// VmRSS and VmHWM of a `/proc/PID/status` text.
pub fn parse_status(status: &str) -> Option<Memory> {
    let kb = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
    };
    Some(Memory { rss_mb: kb("VmRSS:")? / 1024.0, peak_mb: kb("VmHWM:")? / 1024.0 })
}

impl ControlProcess {
    /// Starts `slipstream control` on two free loopback ports.
    pub fn start(files: &ControlFiles, cluster_id: &str) -> anyhow::Result<ControlProcess> {
        let exe = std::env::current_exe().context("finding this program's path")?;
        let (xds, monitor) = (free_port()?, free_port()?);
        let log = std::fs::File::create(&files.log).with_context(|| format!("creating {}", files.log.display()))?;
        let child = Command::new(&exe)
            .arg("control")
            .arg("--source")
            .arg(format!("dir:{}", files.objects.display()))
            .args(["--listen", &xds.to_string(), "--monitor", &monitor.to_string()])
            .arg("--node-tokens")
            .arg(&files.node_tokens)
            .arg("--ca-dir")
            .arg(&files.ca_dir)
            .args(["--cluster-id", cluster_id])
            // Every simulated proxy connects from 127.0.0.1.
            .args(["--max-connections-per-peer", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} control", exe.display()))?;
        let pid = child.id();
        Ok(ControlProcess { child: Some(child), pid, xds, monitor })
    }

    /// Waits until /ready answers 200 (the objects are read whole and the
    /// xDS port serves), or fails with the end of its log.
    pub fn wait_ready(&mut self, timeout: Duration, log: &Path) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            if let Some(child) = &mut self.child {
                if let Some(status) = child.try_wait()? {
                    bail!("the control plane exited ({status}) before it was ready:\n{}", tail(log));
                }
            }
            if ready(self.monitor) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("the control plane was not ready within {timeout:?}:\n{}", tail(log));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn memory(&self) -> anyhow::Result<Memory> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        parse_status(&text).with_context(|| format!("{path}: no VmRSS or VmHWM"))
    }

    /// SIGTERM, up to 5 s to finish, then SIGKILL.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        slipstream_testbed::sys::signals::stop_child(&mut child, Duration::from_secs(5));
    }
}

impl Drop for ControlProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET /ready` answers 200.
fn ready(monitor: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&monitor, Duration::from_millis(200)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// The last lines of a log, for an error.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_and_its_peak() {
        let status = "Name:\tslipstream\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n";
        let m = parse_status(status).unwrap();
        assert_eq!(m, Memory { rss_mb: 100.0, peak_mb: 200.0 });
        assert_eq!(parse_status("Name:\tx\n"), None);
    }
}
