//! A directory of manifests as a source of objects: every `*.yaml`,
//! `*.yml` and `*.json` file under it (recursively; names starting with a
//! dot are skipped, so a writer's temporary files are never read half
//! written), diffed per file into events.
//!
//! Watched by polling, woken by inotify. A poll lists files and compares
//! each one's inode, size, modification and change times with the last
//! poll's, and reads only the files that differ. Every interval the whole
//! tree is listed; in between, as soon as inotify says something changed
//! ([`wake`]; a burst of events settles first), only the directories the
//! events name are, so a change costs the same in a tree of ten files or
//! of ten thousand. The listing is the truth and the events only a reason
//! to look now: it works on every file system (without inotify, at the
//! interval), and cannot miss a change (it is level-triggered: a lost
//! event costs one interval). Writers replace files by renaming a complete
//! temporary file over them (the agent does), which changes the inode, so
//! even a rewrite within one timestamp tick of the same size is seen.
//!
//! Each object is held once, in the file state; a poll compares only the
//! objects of the files it read or lost, never the whole tree.
//!
//! A file is taken whole or not at all: if any document of it does not
//! parse or validate, every error is logged (file, kind, namespace/name,
//! field) and the objects it held before stay in force until it is fixed
//! or removed. An object defined in two files belongs to the first file
//! that defined it; the other file's copy is reported and ignored.

use crate::objects::{ClusterObject, ObjectError, ObjectRef};
use crate::source::ObjectEvent;
use crate::translate::parse_manifests;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod wake;

/// How often `watch` lists the whole tree (changes wake it sooner).
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

/// The objects of one file, by reference.
type Objects = BTreeMap<ObjectRef, ClusterObject>;

#[derive(Debug, Default)]
struct FileState {
    stamp: Option<Stamp>,
    /// The objects this file holds (its last good version).
    objects: BTreeMap<ObjectRef, ClusterObject>,
    /// The last poll that listed it.
    listed: u64,
}

/// What the next poll lists.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    Everything,
    /// These directories; each with its subdirectories (true) or alone.
    Dirs(BTreeMap<PathBuf, bool>),
}

impl Scope {
    /// Whether a listing of this scope would list `file`.
    fn covers(&self, file: &Path) -> bool {
        let Scope::Dirs(dirs) = self else { return true };
        let file = file.as_os_str().as_bytes();
        dirs.iter().any(|(dir, recursive)| {
            let dir = dir.as_os_str().as_bytes();
            file.len() > dir.len() + 1
                && file.starts_with(dir)
                && file[dir.len()] == b'/'
                && (*recursive || !file[dir.len() + 1..].contains(&b'/'))
        })
    }
}

pub struct DirSource {
    root: PathBuf,
    files: HashMap<Arc<Path>, FileState>,
    /// Every file that defines each object; the first in path order is
    /// the one that counts.
    owners: HashMap<ObjectRef, BTreeSet<Arc<Path>>>,
    /// The file whose copy of each object the events so far have said.
    sent: HashMap<ObjectRef, Arc<Path>>,
    errors: BTreeMap<PathBuf, Vec<ObjectError>>,
    /// None when inotify is not available: polls at the interval only.
    wake: Option<wake::Wake>,
    next: Scope,
    last_full: Option<Instant>,
    polls: u64,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let wake = wake::Wake::new()
            .inspect_err(|e| tracing::warn!(dir = %root.display(), "inotify is not available ({e}): changes are seen at each poll only"))
            .ok();
        DirSource {
            root,
            files: HashMap::new(),
            owners: HashMap::new(),
            sent: HashMap::new(),
            errors: BTreeMap::new(),
            wake,
            next: Scope::Everything,
            last_full: None,
            polls: 0,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The files whose last version was refused, with why.
    pub fn errors(&self) -> &BTreeMap<PathBuf, Vec<ObjectError>> {
        &self.errors
    }

    /// One look at the directory: the events since the last poll (every
    /// object, the first time); deletions first. Lists the whole tree,
    /// unless the last [`wait`](Self::wait) was woken by events: then the
    /// directories they named.
    pub fn poll(&mut self) -> Vec<(ObjectEvent, Origin)> {
        let scope = std::mem::replace(&mut self.next, Scope::Everything);
        self.polls += 1;
        let Some(seen) = self.list(&scope) else { return Vec::new() };
        let mut parsed = self.read_changed(seen);
        let polls = self.polls;
        let gone: Vec<Arc<Path>> =
            self.files.iter().filter(|(p, st)| st.listed != polls && scope.covers(p)).map(|(p, _)| p.clone()).collect();
        if parsed.is_empty() && gone.is_empty() {
            return Vec::new();
        }
        let (before, affected) = self.swap_in(&mut parsed, &gone);
        self.events(affected, &parsed, &before)
    }

    /// The manifests `scope` lists, with their stamps; None when nothing
    /// can be said (the root is gone, or cannot be listed).
    fn list(&mut self, scope: &Scope) -> Option<Vec<(PathBuf, Stamp)>> {
        let mut seen = Vec::new();
        let mut dirs = HashSet::new();
        let mut listing = Listing { files: &mut seen, dirs: &mut dirs, wake: self.wake.as_mut() };
        let listed = match scope {
            Scope::Everything => std::fs::metadata(&self.root).and_then(|m| listing.dir(&self.root, m.ino(), true)),
            Scope::Dirs(scoped) => scoped.iter().try_for_each(|(dir, recursive)| {
                match std::fs::metadata(dir).and_then(|m| listing.dir(dir, m.ino(), *recursive)) {
                    // Gone: the files it held are, too.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    other => other,
                }
            }),
        };
        match listed {
            Ok(()) => {}
            // The root itself is gone (removed, or not made yet): nothing
            // is known, which is not the same as "every object was
            // deleted". What was read stays until it is back.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && *scope == Scope::Everything => {
                self.next = Scope::Everything;
                return None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), "cannot list the object directory: {e}");
                // A transient error must not read as "every file is gone".
                return None;
            }
        }
        if *scope == Scope::Everything {
            self.last_full = Some(Instant::now());
            if let Some(w) = &mut self.wake {
                w.keep_only(&dirs);
            }
        }
        Some(seen)
    }

    /// Reads the files of `seen` that changed since the last poll: the
    /// objects of each that parses; the errors of each that does not are
    /// logged and kept, and its previous objects stay.
    fn read_changed(&mut self, seen: Vec<(PathBuf, Stamp)>) -> BTreeMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>> {
        let mut parsed: BTreeMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>> = BTreeMap::new();
        for (path, stamp) in seen {
            let (key, state) = match self.files.get_key_value(path.as_path()) {
                Some((k, _)) => {
                    let k = k.clone();
                    let state = self.files.get_mut(&k).expect("just found");
                    (k, state)
                }
                None => {
                    let k: Arc<Path> = path.as_path().into();
                    (k.clone(), self.files.entry(k).or_default())
                }
            };
            state.listed = self.polls;
            if state.stamp == Some(stamp) {
                continue;
            }
            state.stamp = Some(stamp);
            let text = match std::fs::read_to_string(&path) {
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
                    self.errors.remove(&path);
                    parsed.insert(key, objects);
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
                    self.errors.insert(path, errors);
                }
            }
        }
        parsed
    }

    /// Puts the new versions of the `parsed` files in place and forgets the
    /// `gone` ones: the versions they held until now, and every object they
    /// held or hold.
    fn swap_in(
        &mut self,
        parsed: &mut BTreeMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>>,
        gone: &[Arc<Path>],
    ) -> (HashMap<Arc<Path>, Objects>, BTreeSet<ObjectRef>) {
        // The versions these files held until now; the new ones go in
        // place. Every object they held or hold is looked at again.
        let mut before: HashMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>> = HashMap::new();
        let mut affected: BTreeSet<ObjectRef> = BTreeSet::new();
        for path in gone {
            self.errors.remove(&path.to_path_buf());
            if let Some(state) = self.files.remove(path) {
                before.insert(path.clone(), state.objects);
            }
        }
        for (path, objects) in parsed.iter_mut() {
            if let Some(state) = self.files.get_mut(path) {
                before.insert(path.clone(), std::mem::replace(&mut state.objects, std::mem::take(objects)));
            }
        }
        for (path, old) in &before {
            for r in old.keys() {
                if let Some(owners) = self.owners.get_mut(r) {
                    owners.remove(path);
                    if owners.is_empty() {
                        self.owners.remove(r);
                    }
                }
                affected.insert(r.clone());
            }
        }
        for path in parsed.keys() {
            for r in self.files[path].objects.keys() {
                self.owners.entry(r.clone()).or_default().insert(path.clone());
                affected.insert(r.clone());
            }
        }
        (before, affected)
    }

    /// The events that bring what was sent to what the files say now about
    /// each `affected` object: deletions first.
    fn events(
        &mut self,
        affected: BTreeSet<ObjectRef>,
        parsed: &BTreeMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>>,
        before: &HashMap<Arc<Path>, BTreeMap<ObjectRef, ClusterObject>>,
    ) -> Vec<(ObjectEvent, Origin)> {
        let mut deletes = Vec::new();
        let mut upserts = Vec::new();
        for r in affected {
            let owners = self.owners.get(&r);
            let owner = owners.and_then(|o| o.first()).cloned();
            if let (Some(owners), Some(first)) = (owners, &owner) {
                for other in owners.iter().skip(1) {
                    if parsed.contains_key(other) || parsed.contains_key(first) {
                        tracing::error!(file = %other.display(), object = %r, "defined twice: {} holds it already; this copy is ignored", first.display());
                    }
                }
            }
            let previous =
                self.sent.get(&r).and_then(|p| before.get(p).or_else(|| self.files.get(p).map(|f| &f.objects))).and_then(|m| m.get(&r));
            match owner {
                None => {
                    if let Some(from) = self.sent.remove(&r) {
                        deletes.push((ObjectEvent::Delete(r), Origin { file: from.to_path_buf() }));
                    }
                }
                Some(owner) => {
                    let object = &self.files[&owner].objects[&r];
                    if previous != Some(object) {
                        upserts.push((ObjectEvent::Upsert(object.clone()), Origin { file: owner.to_path_buf() }));
                    }
                    self.sent.insert(r, owner);
                }
            }
        }
        deletes.extend(upserts);
        deletes
    }

    /// Blocks until the next poll is due: something under the directory
    /// changed (inotify; the burst settled), or `interval` passed since
    /// the last whole listing. True when a change woke it; the next
    /// [`poll`](Self::poll) then lists only what the change touched.
    pub fn wait(&mut self, interval: Duration) -> bool {
        let left = self.last_full.map_or(Duration::ZERO, |t| interval.saturating_sub(t.elapsed()));
        let Some(w) = &mut self.wake else {
            std::thread::sleep(left);
            return false;
        };
        match w.wait(left) {
            wake::Woken::Timeout => false,
            wake::Woken::Everything => true,
            wake::Woken::Dirs(dirs) => {
                self.next = Scope::Dirs(dirs);
                true
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

/// One listing.
struct Listing<'a> {
    /// Every manifest, with its stamp.
    files: &'a mut Vec<(PathBuf, Stamp)>,
    /// Every directory listed.
    dirs: &'a mut HashSet<PathBuf>,
    wake: Option<&'a mut wake::Wake>,
}

impl Listing<'_> {
    /// The manifests in `dir` (inode `ino`), and with `recursive` in its
    /// subdirectories; without, in those not watched yet (new ones).
    /// Symbolic links to directories are not followed, so a loop cannot
    /// hang the poll. Each directory is watched before it is read: what
    /// is made in it afterwards wakes the next poll.
    fn dir(&mut self, dir: &Path, ino: u64, recursive: bool) -> std::io::Result<()> {
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
                let ino = entry.ino();
                if !recursive && self.wake.as_deref().is_some_and(|w| w.watches(&path, ino)) {
                    continue;
                }
                match self.dir(&path, ino, true) {
                    // Removed while we looked: its files are gone, as they should read.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    other => other?,
                }
            } else if is_manifest(name) {
                // A regular file's stamp from the directory (no path
                // walk); a symbolic link's from its target.
                let m = if ft.is_symlink() { std::fs::metadata(&path) } else { entry.metadata() };
                if let Ok(m) = m {
                    if m.is_file() {
                        self.files.push((path, Stamp::of(&m)));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
