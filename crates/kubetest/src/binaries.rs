//! Where etcd and kube-apiserver come from, and the loud error when either is
//! missing: the Kubernetes tests fail without them, they never skip.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The same default and override as `scripts/kube-apiserver.sh`.
const KUBE_CACHE: &str = "/var/tmp/slipstream-kube";
/// The minor version our Rust types are generated for (k8s-openapi `v1_32`).
const KUBE_APISERVER_PREFIX: &str = "kube-apiserver-v1.32.";

/// A program found, and how: printed by every test that starts a server so
/// that a log says which binaries the run used.
#[derive(Debug, Clone)]
pub struct Found {
    pub path: PathBuf,
    pub how: String,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.how)
    }
}

#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: Found,
    pub apiserver: Found,
}

/// Finds both programs, or names everything missing in one error together
/// with the command that provides it.
pub fn find() -> anyhow::Result<Binaries> {
    match (find_etcd(), find_apiserver()) {
        (Ok(etcd), Ok(apiserver)) => Ok(Binaries { etcd, apiserver }),
        (etcd, apiserver) => {
            let mut msg = String::from(
                "\n\n*** kubetest: MISSING PREREQUISITES: the Kubernetes tests need a real etcd and kube-apiserver,\n\
                 *** and FAIL (never skip) without them. `make test` provides both (scripts/setup.sh, scripts/test.sh).\n",
            );
            for problem in [etcd.err(), apiserver.err()].into_iter().flatten() {
                msg.push_str(&format!("***   - {problem}\n"));
            }
            anyhow::bail!(msg)
        }
    }
}

fn find_etcd() -> Result<Found, String> {
    if let Some(path) = std::env::var_os("SLIPSTREAM_ETCD") {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(Found { path, how: "from SLIPSTREAM_ETCD".into() })
        } else {
            Err(format!("etcd: SLIPSTREAM_ETCD={} is not an executable file", path.display()))
        };
    }
    let packaged = Path::new("/usr/bin/etcd");
    if is_executable(packaged) {
        return Ok(Found { path: packaged.into(), how: "Debian package etcd-server".into() });
    }
    if let Some(path) = on_path("etcd") {
        return Ok(Found { path, how: "found on PATH".into() });
    }
    Err("etcd: not at /usr/bin/etcd nor on PATH. Install it with: apt-get install etcd-server \
         (scripts/setup.sh does), or point SLIPSTREAM_ETCD at one"
        .into())
}

fn find_apiserver() -> Result<Found, String> {
    if let Some(path) = std::env::var_os("SLIPSTREAM_KUBE_APISERVER") {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(Found { path, how: "from SLIPSTREAM_KUBE_APISERVER".into() })
        } else {
            Err(format!("kube-apiserver: SLIPSTREAM_KUBE_APISERVER={} is not an executable file", path.display()))
        };
    }
    let cache = std::env::var_os("SLIPSTREAM_KUBE_CACHE").map_or_else(|| PathBuf::from(KUBE_CACHE), PathBuf::from);
    let bin = cache.join("bin");
    match newest_build(&bin) {
        Some(path) => Ok(Found { path, how: format!("built by scripts/kube-apiserver.sh into {}", bin.display()) }),
        None => Err(format!(
            "kube-apiserver: SLIPSTREAM_KUBE_APISERVER is unset and {} holds no {KUBE_APISERVER_PREFIX}*. \
             Build it with: scripts/kube-apiserver.sh (10-15 minutes once; Go's caches keep it)",
            bin.display()
        )),
    }
}

/// The highest patch release in `dir`: `kube-apiserver-v1.32.<patch>`, where
/// the patch is all digits (a build in progress is `...<patch>.tmp.<pid>`).
fn newest_build(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let patch = path.file_name()?.to_str()?.strip_prefix(KUBE_APISERVER_PREFIX)?.parse::<u32>().ok()?;
            is_executable(&path).then_some((patch, path))
        })
        .max_by_key(|(patch, _)| *patch)
        .map(|(_, path)| path)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_build_picks_the_highest_complete_patch() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["kube-apiserver-v1.32.9", "kube-apiserver-v1.32.13", "kube-apiserver-v1.32.14.tmp.77", "kube-apiserver-v1.33.1"] {
            let path = dir.path().join(name);
            std::fs::write(&path, "").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // Not executable: not a finished build.
        std::fs::write(dir.path().join("kube-apiserver-v1.32.20"), "").unwrap();
        assert_eq!(newest_build(dir.path()), Some(dir.path().join("kube-apiserver-v1.32.13")));
        assert_eq!(newest_build(&dir.path().join("absent")), None);
    }
}
