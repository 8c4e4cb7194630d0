//! A directory of manifests as a source of objects: every `*.yaml`,
//! `*.yml` and `*.json` file under it (recursively; names starting with a
//! dot are skipped, so a writer's temporary files are never read half
//! written), diffed per file into events.
//!
//! Watched by polling, woken by inotify: each poll lists the tree and
//! compares each file's inode, size, modification and change times with
//! the last poll's, and reads only the files that differ. Polls run every
//! interval, and as soon as inotify says something under the directory
//! changed ([`wake`]; a burst of events settles first). The listing is the
//! truth and the events only a reason to look now: it works on every file
//! system (without inotify, at the interval), and cannot miss a change (it
//! is level-triggered: a lost event costs one interval). Writers replace
//! files by renaming a complete temporary file over them (the agent does),
//! which changes the inode, so even a rewrite within one timestamp tick of
//! the same size is seen.
//!
//! A file is taken whole or not at all: if any document of it does not
//! parse or validate, every error is logged (file, kind, namespace/name,
//! field) and the objects it held before stay in force until it is fixed
//! or removed. An object defined in two files belongs to the first file
//! that defined it; the other file's copy is reported and ignored.

use crate::index::ObjectEvent;
use crate::objects::{parse_manifests, ClusterObject, ObjectError, ObjectRef};
use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod wake;

/// How often `watch` polls when nothing wakes it.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Where an event came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: PathBuf,
}

/// What a file looked like at the last poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp { ino: m.ino(), len: m.len(), mtime: (m.mtime(), m.mtime_nsec()), ctime: (m.ctime(), m.ctime_nsec()) }
    }
}

#[derive(Debug, Default)]
struct FileState {
    stamp: Option<Stamp>,
    /// The objects this file holds (its last good version).
    objects: BTreeMap<ObjectRef, ClusterObject>,
}

pub struct DirSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// What the events so far have said: each object and its file.
    current: BTreeMap<ObjectRef, (ClusterObject, PathBuf)>,
    errors: BTreeMap<PathBuf, Vec<ObjectError>>,
    /// None when inotify is not available: polls at the interval only.
    wake: Option<wake::Wake>,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let wake = wake::Wake::new()
            .inspect_err(|e| tracing::warn!(dir = %root.display(), "inotify is not available ({e}): changes are seen at each poll only"))
            .ok();
        DirSource { root, files: BTreeMap::new(), current: BTreeMap::new(), errors: BTreeMap::new(), wake }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The files whose last version was refused, with why.
    pub fn errors(&self) -> &BTreeMap<PathBuf, Vec<ObjectError>> {
        &self.errors
    }

    /// One look at the directory: the events since the last poll (every
    /// object, the first time); deletions first.
    pub fn poll(&mut self) -> Vec<(ObjectEvent, Origin)> {
        let mut seen = BTreeMap::new();
        let mut dirs = HashSet::new();
        let root_ino = std::fs::metadata(&self.root).map(|m| m.ino());
        let listed = root_ino.and_then(|ino| {
            let mut listing = Listing { files: &mut seen, dirs: &mut dirs, wake: self.wake.as_mut() };
            listing.dir(&self.root, ino)
        });
        match listed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), "cannot list the object directory: {e}");
                // A transient error must not read as "every file is gone".
                return Vec::new();
            }
        }
        if let Some(w) = &mut self.wake {
            w.keep_only(&dirs);
        }
        // Read what changed.
        let mut parsed: BTreeMap<PathBuf, BTreeMap<ObjectRef, ClusterObject>> = BTreeMap::new();
        for (path, stamp) in &seen {
            let state = self.files.entry(path.clone()).or_default();
            if state.stamp == Some(*stamp) {
                continue;
            }
            state.stamp = Some(*stamp);
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    // Gone between listing and reading, or unreadable: seen again next poll.
                    state.stamp = None;
                    tracing::warn!(file = %path.display(), "cannot read: {e}");
                    continue;
                }
            };
            match parse_file(&text) {
                Ok(objects) => {
                    self.errors.remove(path);
                    parsed.insert(path.clone(), objects);
                }
                Err(errors) => {
                    for e in &errors {
                        tracing::error!(
                            file = %path.display(),
                            kind = %e.kind,
                            object = %e.object(),
                            field = %e.field,
                            "refused, the file's previous objects stay in force: {e}"
                        );
                    }
                    self.errors.insert(path.clone(), errors);
                }
            }
        }
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !seen.contains_key(*p)).cloned().collect();
        if parsed.is_empty() && gone.is_empty() {
            return Vec::new();
        }
        for path in &gone {
            self.errors.remove(path);
            self.files.remove(path);
        }
        let parsed: std::collections::BTreeSet<PathBuf> = parsed
            .into_iter()
            .map(|(path, objects)| {
                self.files.entry(path.clone()).or_default().objects = objects;
                path
            })
            .collect();
        // What the files hold now, each object from the first file (in
        // path order) that defines it; then the difference with what was
        // sent before.
        let mut desired: BTreeMap<&ObjectRef, (&ClusterObject, &PathBuf)> = BTreeMap::new();
        for (path, state) in &self.files {
            for (r, o) in &state.objects {
                match desired.get(r) {
                    None => {
                        desired.insert(r, (o, path));
                    }
                    Some((_, first)) if parsed.contains(path) || parsed.contains(*first) => {
                        tracing::error!(file = %path.display(), object = %r, "defined twice: {} holds it already; this copy is ignored", first.display());
                    }
                    Some(_) => {}
                }
            }
        }
        let mut events = Vec::new();
        let removed: Vec<(ObjectRef, PathBuf)> =
            self.current.iter().filter(|(r, _)| !desired.contains_key(r)).map(|(r, (_, p))| (r.clone(), p.clone())).collect();
        for (r, file) in removed {
            self.current.remove(&r);
            events.push((ObjectEvent::Delete(r), Origin { file }));
        }
        for (r, (o, path)) in desired {
            match self.current.get_mut(r) {
                Some((cur, from)) if cur == o => {
                    if from != path {
                        *from = path.clone();
                    }
                }
                _ => {
                    self.current.insert(r.clone(), (o.clone(), path.clone()));
                    events.push((ObjectEvent::Upsert(o.clone()), Origin { file: path.clone() }));
                }
            }
        }
        events
    }

    /// Blocks until the next poll is due: something under the directory
    /// changed (inotify; the burst settled), or `interval` passed since
    /// the call. True when a change woke it.
    pub fn wait(&mut self, interval: Duration) -> bool {
        match &mut self.wake {
            Some(w) => w.wait(interval),
            None => {
                std::thread::sleep(interval);
                false
            }
        }
    }

    /// Polls on a thread of its own (polling reads files, which would
    /// block an async runtime), when a change wakes it and at least every
    /// `interval`, and sends each non-empty batch of events; stops when
    /// the receiver is dropped.
    pub fn watch(mut self, interval: Duration) -> tokio::sync::mpsc::Receiver<Vec<(ObjectEvent, Origin)>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        std::thread::Builder::new()
            .name("dir-source".into())
            .spawn(move || loop {
                let events = self.poll();
                if !events.is_empty() && tx.blocking_send(events).is_err() {
                    return;
                }
                if tx.is_closed() {
                    return;
                }
                self.wait(interval);
            })
            .expect("spawning the directory source's thread");
        rx
    }
}

/// Every object of a file by reference, or every error; an object defined
/// twice in one file is an error.
fn parse_file(text: &str) -> Result<BTreeMap<ObjectRef, ClusterObject>, Vec<ObjectError>> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for o in parse_manifests(text)? {
        let r = o.object_ref();
        if out.contains_key(&r) {
            errors.push(ObjectError::new(&r, "", "defined twice in this file"));
        }
        out.insert(r, o);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn is_manifest(name: &str) -> bool {
    !name.starts_with('.') && [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e))
}

/// One listing of the tree.
struct Listing<'a> {
    /// Every manifest, with its stamp.
    files: &'a mut BTreeMap<PathBuf, Stamp>,
    /// Every directory listed.
    dirs: &'a mut HashSet<PathBuf>,
    wake: Option<&'a mut wake::Wake>,
}

impl Listing<'_> {
    /// The manifests under `dir` (inode `ino`), recursively (symbolic
    /// links to directories are not followed, so a loop cannot hang the
    /// poll). Each directory is watched before it is read: what is made
    /// in it afterwards wakes the next poll.
    fn dir(&mut self, dir: &Path, ino: u64) -> std::io::Result<()> {
        if let Some(w) = self.wake.as_deref_mut() {
            w.watch(dir, ino);
        }
        self.dirs.insert(dir.to_path_buf());
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let ft = entry.file_type()?;
            if ft.is_dir() {
                match self.dir(&path, entry.ino()) {
                    // Removed while we looked: its files are gone, as they should read.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    other => other?,
                }
            } else if is_manifest(name) {
                if let Ok(m) = std::fs::metadata(&path) {
                    if m.is_file() {
                        self.files.insert(path, Stamp::of(&m));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
