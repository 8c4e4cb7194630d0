//! Which cluster a command acts on: a Kubernetes install (through its API
//! server) or the local cluster named by `--cluster`. The decision is
//! [`choose`], pure over plain data; [`from_cli`] gathers that data.
//!
//! Precedence (docs/kubernetes.md, "The CLI on Kubernetes"):
//! 1. `--kubeconfig` or `--context` given: Kubernetes, always;
//! 2. `KUBECONFIG` set (not empty) and no local cluster of that name is
//!    present (its agent's socket or state file): Kubernetes;
//! 3. otherwise the local cluster.

use std::path::PathBuf;

/// The flags every command that can act on Kubernetes takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KubeFlags {
    /// Act on the Kubernetes install this kubeconfig reaches (its API
    /// server), not on a local cluster. Also `KUBECONFIG`, when no local
    /// cluster named by --cluster is running.
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context);
    /// implies Kubernetes.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

/// Why a command acts on Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    /// `--kubeconfig` or `--context`.
    Flag,
    /// `KUBECONFIG`, with no local cluster of the name running.
    Env,
}

/// A Kubernetes install to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeTarget {
    /// The kubeconfig file given with `--kubeconfig`; `None` reads
    /// `KUBECONFIG` (a list of files, merged) or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub chosen: Chosen,
}

impl KubeTarget {
    /// How `status` names where it looked.
    pub fn describe(&self, env_kubeconfig: Option<&str>) -> String {
        let file = match (&self.kubeconfig, env_kubeconfig) {
            (Some(p), _) => format!("--kubeconfig {}", p.display()),
            (None, Some(e)) if !e.is_empty() => format!("KUBECONFIG={e}"),
            (None, _) => "~/.kube/config".to_string(),
        };
        match &self.context {
            Some(c) => format!("{file}, context {c}"),
            None => file,
        }
    }
}

/// The target (pure, for tests): `local_present` is asked only when it
/// decides (no flag, `KUBECONFIG` set).
pub fn choose(flags: &KubeFlags, env_kubeconfig: Option<&str>, local_present: impl FnOnce() -> bool) -> Option<KubeTarget> {
    if flags.kubeconfig.is_some() || flags.context.is_some() {
        return Some(KubeTarget { kubeconfig: flags.kubeconfig.clone(), context: flags.context.clone(), chosen: Chosen::Flag });
    }
    match env_kubeconfig {
        Some(e) if !e.trim().is_empty() && !local_present() => Some(KubeTarget { kubeconfig: None, context: None, chosen: Chosen::Env }),
        _ => None,
    }
}

/// Whether a local cluster of this name is present: its agent's socket or
/// its state file exists (a cluster whose agent died still counts: its
/// `status` says so).
pub fn local_present(cluster: &str) -> bool {
    crate::common::Ctx::new(cluster).is_ok_and(|c| c.paths.socket().exists() || c.paths.state_file().exists())
}

/// The target of this invocation, from the flags, the environment and
/// the machine.
pub fn from_cli(cluster: &str, flags: &KubeFlags) -> Option<KubeTarget> {
    let env = std::env::var("KUBECONFIG").ok();
    choose(flags, env.as_deref(), || local_present(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        let none = KubeFlags::default();
        let file = KubeFlags { kubeconfig: Some("/k".into()), context: None };
        let ctx = KubeFlags { kubeconfig: None, context: Some("prod".into()) };
        // (flags, KUBECONFIG, local cluster present, want)
        let cases: &[(&KubeFlags, Option<&str>, bool, Option<Chosen>)] = &[
            (&none, None, false, None),
            (&none, None, true, None),
            (&none, Some(""), false, None),
            (&none, Some("/env"), false, Some(Chosen::Env)),
            // A running local cluster wins over the environment...
            (&none, Some("/env"), true, None),
            // ...never over a flag.
            (&file, None, true, Some(Chosen::Flag)),
            (&file, Some("/env"), true, Some(Chosen::Flag)),
            (&ctx, None, true, Some(Chosen::Flag)),
        ];
        for (flags, env, local, want) in cases {
            let got = choose(flags, *env, || *local).map(|t| t.chosen);
            assert_eq!(got, *want, "{flags:?} KUBECONFIG={env:?} local={local}");
        }
        assert_eq!(choose(&file, Some("/env"), || true).unwrap().kubeconfig, Some("/k".into()));
    }

    #[test]
    fn the_local_cluster_is_looked_for_only_when_it_decides() {
        let file = KubeFlags { kubeconfig: Some("/k".into()), context: None };
        choose(&file, Some("/env"), || panic!("asked"));
        choose(&KubeFlags::default(), None, || panic!("asked"));
    }

    #[test]
    fn described() {
        let t = KubeTarget { kubeconfig: Some("/k".into()), context: Some("c".into()), chosen: Chosen::Flag };
        assert_eq!(t.describe(Some("/env")), "--kubeconfig /k, context c");
        let t = KubeTarget { kubeconfig: None, context: None, chosen: Chosen::Env };
        assert_eq!(t.describe(Some("/env")), "KUBECONFIG=/env");
    }
}
