//! Commands in the client pod, through `kubectl exec`.
//!
//! Why kubectl rather than kube-rs: exec over the API server needs the
//! client's websocket feature, which the bench does not otherwise link, and
//! an experiment is one long-running command whose output goes to a file
//! and whose exit code matters; `kubectl exec` as a child process fits the
//! local bench's exec (its own process group, a timeout, Ctrl-C stops it,
//! `crate::cluster::supervise`) unchanged.

use anyhow::{bail, Context};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub struct Kubectl {
    pub exe: PathBuf,
    pub kubeconfig: PathBuf,
    pub context: Option<String>,
}

impl Kubectl {
    /// `kubectl` on the PATH; fails with what to do when it is not there.
    pub fn find(kubeconfig: &Path, context: Option<&str>) -> anyhow::Result<Kubectl> {
        let path = std::env::var("PATH").unwrap_or_default();
        let Some(exe) = crate::preflight::find_in(&path, "kubectl") else {
            bail!("kubectl not found on the PATH: `slipstream bench --kubeconfig` runs the experiments' clients with `kubectl exec`");
        };
        Ok(Kubectl { exe, kubeconfig: kubeconfig.to_path_buf(), context: context.map(String::from) })
    }

    /// The arguments of `kubectl exec` running `argv` in a container.
    pub fn exec_args(&self, ns: &str, pod: &str, container: &str, argv: &[String]) -> Vec<String> {
        let mut a: Vec<String> = vec!["--kubeconfig".into(), self.kubeconfig.display().to_string()];
        if let Some(c) = &self.context {
            a.extend(["--context".into(), c.clone()]);
        }
        a.extend(["exec", "-n", ns, pod, "-c", container, "--"].iter().map(|s| s.to_string()));
        a.extend(argv.iter().cloned());
        a
    }

    /// Runs `argv` in the container with its output in files; returns the
    /// exit code (kubectl's, which is the command's).
    pub fn exec(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        argv: &[String],
        out: (&Path, &Path),
        timeout: Duration,
    ) -> anyhow::Result<i32> {
        let child = Command::new(&self.exe)
            .args(self.exec_args(ns, pod, container, argv))
            .stdin(Stdio::null())
            .stdout(File::create(out.0).with_context(|| format!("creating {}", out.0.display()))?)
            .stderr(File::create(out.1).with_context(|| format!("creating {}", out.1.display()))?)
            .process_group(0)
            .spawn()
            .context("running `kubectl exec`")?;
        let st = crate::cluster::supervise(child, timeout, true)?;
        Ok(st.code().unwrap_or(-1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_arguments() {
        let mut k = Kubectl { exe: "kubectl".into(), kubeconfig: "/tmp/kc".into(), context: None };
        let a = k.exec_args("bench-none", "client", "fortio", &["fortio".into(), "load".into()]);
        assert_eq!(a.join(" "), "--kubeconfig /tmp/kc exec -n bench-none client -c fortio -- fortio load");
        k.context = Some("kind-x".into());
        assert_eq!(k.exec_args("n", "p", "c", &[]).join(" "), "--kubeconfig /tmp/kc --context kind-x exec -n n p -c c --");
    }
}
