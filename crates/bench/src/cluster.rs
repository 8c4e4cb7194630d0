//! Drives the bench's local cluster through the `slipstream` binary's own
//! commands (`up`, `status -o json`, `exec`, `down`), the interfaces users
//! and tests rely on. Every child runs in its own process group, so Ctrl-C
//! reaches only the bench, which then stops its child and cleans up.

use anyhow::{bail, Context};
use slipstream_testbed::status::ClusterStatus;
use slipstream_testbed::sys::signals;
use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The run was interrupted (SIGINT/SIGTERM): stop, clean up, keep what was measured.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

pub fn interrupted() -> bool {
    signals::terminate_requested()
}

pub struct Cluster {
    exe: PathBuf,
    pub name: String,
    /// `up` and `down` output goes here.
    log: PathBuf,
}

/// Node proxy bounds the bench sets for its own cluster (see `Cluster::up`).
pub const BENCH_LIMITS: [(&str, &str); 2] = [("SLIPSTREAM_NODE_POD_CONNECTIONS", "12000"), ("SLIPSTREAM_NODE_PEER_STREAMS", "12000")];

impl Cluster {
    pub fn new(exe: PathBuf, name: &str, log: PathBuf) -> Cluster {
        Cluster { exe, name: name.to_string(), log }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.exe);
        c.arg("--cluster").arg(&self.name).args(args).stdin(Stdio::null()).process_group(0);
        c
    }

    fn logged(&self, args: &[&str]) -> anyhow::Result<Command> {
        let log =
            OpenOptions::new().create(true).append(true).open(&self.log).with_context(|| format!("opening {}", self.log.display()))?;
        let mut c = self.command(args);
        c.stdout(log.try_clone()?).stderr(log);
        Ok(c)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    pub fn up(&self, manifests: &Path, nodes: usize, timeout: Duration) -> anyhow::Result<()> {
        let secs = format!("{}s", timeout.as_secs());
        let nodes = nodes.to_string();
        let mut cmd = self.logged(&["up", "-f", &manifests.display().to_string(), "--nodes", &nodes, "--timeout", &secs])?;
        // R1 holds 10 000 connections from one client pod to one server
        // pod: above the node proxy's default per-pod and per-peer bounds
        // (4 096, docs/node-proxy.md "Limits"), which exist to keep one pod
        // from starving others and would refuse most of them. The bench
        // raises them, unless the caller set them.
        for (k, v) in BENCH_LIMITS {
            if std::env::var_os(k).is_none() {
                cmd.env(k, v);
            }
        }
        let child = cmd.spawn()?;
        let st = supervise(child, timeout + Duration::from_secs(30), true)?;
        if !st.success() {
            bail!("`slipstream --cluster {} up` failed ({st}):\n{}", self.name, self.log_tail());
        }
        Ok(())
    }

    pub fn status(&self) -> anyhow::Result<ClusterStatus> {
        let out = self.command(&["status", "-o", "json"]).output().context("running `slipstream status`")?;
        if !out.status.success() {
            bail!("`slipstream --cluster {} status` failed: {}", self.name, String::from_utf8_lossy(&out.stderr).trim());
        }
        serde_json::from_slice(&out.stdout).context("reading `slipstream status -o json`")
    }

    /// Runs `argv` in a pod with its output in files; returns the exit code.
    pub fn exec(&self, ns: &str, pod: &str, argv: &[String], stdout: &Path, stderr: &Path, timeout: Duration) -> anyhow::Result<i32> {
        let mut args = vec!["exec", "-n", ns, pod, "--"];
        args.extend(argv.iter().map(String::as_str));
        let child = self
            .command(&args)
            .stdout(File::create(stdout).with_context(|| format!("creating {}", stdout.display()))?)
            .stderr(File::create(stderr).with_context(|| format!("creating {}", stderr.display()))?)
            .spawn()
            .context("running `slipstream exec`")?;
        let st = supervise(child, timeout, true)?;
        Ok(st.code().unwrap_or(-1))
    }

    /// Removes the cluster; not interruptible (it is the cleanup).
    pub fn down(&self) -> anyhow::Result<()> {
        let child = self.logged(&["down"])?.spawn()?;
        let st = supervise(child, Duration::from_secs(120), false)?;
        if !st.success() {
            bail!("`slipstream --cluster {} down` failed ({st}):\n{}\nrun it again to finish the cleanup", self.name, self.log_tail());
        }
        Ok(())
    }
}

/// Waits for a child, killing it on timeout or (when `interruptible`) when
/// the bench is asked to stop.
pub fn supervise(mut child: Child, timeout: Duration, interruptible: bool) -> anyhow::Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if interruptible && interrupted() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Interrupted.into());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {}s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes the cluster when dropped, unless [`Teardown::finish`] did.
pub struct Teardown<'a> {
    cluster: &'a Cluster,
    armed: bool,
}

impl<'a> Teardown<'a> {
    pub fn new(cluster: &'a Cluster) -> Self {
        Teardown { cluster, armed: true }
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.armed = false;
        self.cluster.down()
    }
}

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        if self.armed {
            eprintln!("removing cluster {:?}", self.cluster.name);
            if let Err(e) = self.cluster.down() {
                eprintln!("error: {e:#}");
            }
        }
    }
}
