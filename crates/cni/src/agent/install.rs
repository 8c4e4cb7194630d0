//! The plugin on the node: the binary in the CNI bin directory and our
//! entry at the end of the primary CNI's conflist; kept there (a primary
//! CNI that rewrites its file gets our entry back at the next check), and
//! removed on uninstall, the entry first (no new pod calls a plugin that is
//! going) and the binary last.

use crate::conflist::{self, ConflistError, PLUGIN_TYPE};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Conflist(#[from] ConflistError),
    #[error("{dir}: no CNI configuration yet (the primary CNI writes one; waiting for it)")]
    NoPrimary { dir: PathBuf },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io { path: path.to_path_buf(), source }
}

/// Writes `text` to `path` through a temporary file and a rename.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_file_name(format!(".{}.slipstream-tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// What the agent knows of the plugin binary it installed or found equal
/// to itself: the file's identity then (inode, length, status-change time,
/// which no one can set back).
/// While the file keeps it, the check is one stat(2); the contents are
/// compared only at the first check and after the file changed. (Read
/// whole every 5 s, the 60 MB binary twice, the check cost the agent
/// 120 MB and its CPU.)
#[derive(Debug, Default)]
pub struct Installed {
    stamp: Option<(u64, u64, i64, i64)>,
}

fn stamp(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (m.ino(), m.len(), m.ctime(), m.ctime_nsec())
}

/// Whether two files hold the same bytes, read in small pieces.
fn same_contents(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Copies this very binary into `bin_dir` as `slipstream-cni` (when it
/// differs), so the plugin is always the agent's own version. Streams the
/// copy through a temporary file and a rename.
pub fn install_binary(bin_dir: &Path, known: &mut Installed) -> Result<bool, InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let me = Path::new("/proc/self/exe");
    let target = bin_dir.join(PLUGIN_TYPE);
    if let (Some(s), Ok(m)) = (known.stamp, std::fs::metadata(&target)) {
        if stamp(&m) == s {
            return Ok(false);
        }
    }
    if same_contents(me, &target).unwrap_or(false) {
        known.stamp = std::fs::metadata(&target).ok().map(|m| stamp(&m));
        return Ok(false);
    }
    let tmp = target.with_file_name(format!(".{PLUGIN_TYPE}.slipstream-tmp"));
    let copied = std::fs::File::open(me)
        .map_err(io(me))
        .and_then(|mut from| std::fs::File::create(&tmp).and_then(|mut to| std::io::copy(&mut from, &mut to)).map_err(io(&tmp)));
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &target).map_err(io(&target))?;
    known.stamp = std::fs::metadata(&target).ok().map(|m| stamp(&m));
    Ok(true)
}

fn primary(conf_dir: &Path) -> Result<PathBuf, InstallError> {
    let names: Vec<String> =
        std::fs::read_dir(conf_dir).map_err(io(conf_dir))?.flatten().filter_map(|e| e.file_name().into_string().ok()).collect();
    conflist::primary(&names).map(|n| conf_dir.join(n)).ok_or_else(|| InstallError::NoPrimary { dir: conf_dir.into() })
}

/// Chains our entry into the primary conflist; Ok(Some(file)) when it
/// changed the file.
pub fn chain(conf_dir: &Path, agent_socket: &str) -> Result<Option<PathBuf>, InstallError> {
    let file = primary(conf_dir)?;
    let text = std::fs::read_to_string(&file).map_err(io(&file))?;
    match conflist::with_plugin(&file.display().to_string(), &text, &conflist::entry(agent_socket))? {
        Some(new) => {
            replace(&file, new.as_bytes(), 0o644)?;
            Ok(Some(file))
        }
        None => Ok(None),
    }
}

/// Removes our entry from every configuration of the directory, then the
/// binary. Safe to repeat.
pub fn remove(conf_dir: &Path, bin_dir: &Path) -> Result<(), InstallError> {
    for e in std::fs::read_dir(conf_dir).map_err(io(conf_dir))?.flatten() {
        let path = e.path();
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        if let Ok(Some(new)) = conflist::without_plugin(&path.display().to_string(), &text) {
            replace(&path, new.as_bytes(), 0o644)?;
            tracing::info!(file = %path.display(), "our entry removed from the CNI configuration");
        }
    }
    let bin = bin_dir.join(PLUGIN_TYPE);
    match std::fs::remove_file(&bin) {
        Ok(()) => tracing::info!(file = %bin.display(), "plugin binary removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(InstallError::Io { path: bin, source: e }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_into_the_first_conflist_and_removes_cleanly() {
        let conf = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        assert!(matches!(chain(conf.path(), "/s"), Err(InstallError::NoPrimary { .. })));
        let primary = r#"{"cniVersion":"1.0.0","name":"k","plugins":[{"type":"bridge"}]}"#;
        std::fs::write(conf.path().join("10-k.conflist"), primary).unwrap();
        std::fs::write(conf.path().join("20-other.conflist"), primary).unwrap();
        assert_eq!(chain(conf.path(), "/s").unwrap(), Some(conf.path().join("10-k.conflist")));
        assert_eq!(chain(conf.path(), "/s").unwrap(), None, "idempotent");
        assert_eq!(std::fs::read_to_string(conf.path().join("20-other.conflist")).unwrap(), primary, "only the runtime's file");
        let mut known = Installed::default();
        assert!(install_binary(bin.path(), &mut known).unwrap());
        assert!(!install_binary(bin.path(), &mut known).unwrap(), "unchanged (its identity kept): not copied again");
        assert!(!install_binary(bin.path(), &mut Installed::default()).unwrap(), "same bytes (a restarted agent): not copied again");
        let installed = bin.path().join(PLUGIN_TYPE);
        assert!(same_contents(Path::new("/proc/self/exe"), &installed).unwrap());
        // Someone overwrites it: noticed by its changed identity, put back.
        std::fs::write(&installed, b"not the plugin").unwrap();
        assert!(install_binary(bin.path(), &mut known).unwrap(), "a changed file is replaced");
        assert!(same_contents(Path::new("/proc/self/exe"), &installed).unwrap());
        remove(conf.path(), bin.path()).unwrap();
        let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(conf.path().join("10-k.conflist")).unwrap()).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(primary).unwrap());
        assert!(!bin.path().join(PLUGIN_TYPE).exists());
        remove(conf.path(), bin.path()).unwrap();
        let left: Vec<_> = std::fs::read_dir(conf.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
    }
}
