//! Waking the directory source's poll as soon as something under the
//! directory changes (inotify), so that a change reaches the index in
//! milliseconds instead of at the next poll.
//!
//! Events are only ever a reason to look now: what changed is still found
//! by the poll's listing, never read from an event. So a lost event (a
//! queue overflow, a directory filled before its watch was added, a file
//! system without inotify) costs at most one poll interval, never a change.
//!
//! Every directory is watched by the listing itself, just before it reads
//! the directory: an entry made before the watch is listed, one made after
//! it is an event. A wake says which directories to list: the one an
//! event happened in, or for a subdirectory made, removed or renamed, that
//! subdirectory with everything under it (a new one is then watched as it
//! is listed). An event it cannot place (a queue overflow, a watched
//! directory itself removed) asks for the whole tree. Watches of
//! directories a whole listing no longer finds are dropped after it.

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// After a wake, the poll waits until no event came for this long: a
/// writer's burst (temporary file, write, rename; or many files) becomes
/// one poll.
pub const SETTLE: Duration = Duration::from_millis(5);
/// ... but no longer than this after the first event, so that a writer
/// that never pauses still has its changes read.
pub const MAX_SETTLE: Duration = Duration::from_millis(50);

/// What ends the wait for events in a directory: names changing in it
/// (created, removed, renamed in or out), a file written and closed, its
/// attributes (a `touch`), the directory itself going.
fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
}

/// Why a wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Woken {
    Timeout,
    /// Something changed in these directories: each to be listed with its
    /// subdirectories (true) or alone.
    Dirs(BTreeMap<PathBuf, bool>),
    /// Something changed, somewhere: list everything.
    Everything,
}

pub(super) struct Wake {
    fd: OwnedFd,
    /// Each watched directory: its inode when watched (a directory replaced
    /// under the same path is watched again) and its watch descriptor.
    dirs: HashMap<PathBuf, (u64, i32)>,
    /// Each watch's directory (the latest, if a moved one has two paths).
    by_wd: HashMap<i32, PathBuf>,
    /// A watch could not be added (the user's inotify watches are used
    /// up): said once; those directories are seen at each poll only.
    warned: bool,
}

impl Wake {
    pub(super) fn new() -> std::io::Result<Wake> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        Ok(Wake { fd, dirs: HashMap::new(), by_wd: HashMap::new(), warned: false })
    }

    /// Whether `dir` (inode `ino`) is watched.
    pub(super) fn watches(&self, dir: &Path, ino: u64) -> bool {
        self.dirs.get(dir).is_some_and(|(i, _)| *i == ino)
    }

    /// Watches `dir` (inode `ino`) unless it already is.
    pub(super) fn watch(&mut self, dir: &Path, ino: u64) {
        if self.watches(dir, ino) {
            return;
        }
        match inotify::add_watch(&self.fd, dir, mask()) {
            Ok(wd) => {
                self.dirs.insert(dir.to_path_buf(), (ino, wd));
                self.by_wd.insert(wd, dir.to_path_buf());
            }
            // Gone already: the listing will not find it either.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => {}
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(dir = %dir.display(), "cannot watch for changes ({e}); changes there are seen at the next poll");
                }
            }
        }
    }

    /// After a whole listing that found exactly the directories `listed`:
    /// stops watching the others (removed, or moved out of the tree).
    pub(super) fn keep_only(&mut self, listed: &HashSet<PathBuf>) {
        let gone: Vec<PathBuf> = self.dirs.keys().filter(|p| !listed.contains(*p)).cloned().collect();
        for path in gone {
            let Some((_, wd)) = self.dirs.remove(&path) else { continue };
            // One inode has one watch: another path may still use it (a
            // directory moved within the tree).
            match self.dirs.iter().find(|(_, (_, w))| *w == wd) {
                Some((other, _)) => {
                    self.by_wd.insert(wd, other.clone());
                }
                None => {
                    self.by_wd.remove(&wd);
                    // Already gone with its directory: nothing to remove.
                    let _ = inotify::remove_watch(&self.fd, wd);
                }
            }
        }
    }

    /// How many directories are watched.
    #[cfg(test)]
    pub(super) fn watched(&self) -> usize {
        self.dirs.len()
    }

    /// Blocks until something under a watched directory changed (and the
    /// burst settled, see [`SETTLE`]) or `timeout` passed; says where.
    pub(super) fn wait(&mut self, timeout: Duration) -> Woken {
        if !self.ready(timeout) {
            return Woken::Timeout;
        }
        let first = Instant::now();
        let mut woken = Woken::Dirs(BTreeMap::new());
        self.drain(&mut woken);
        while first.elapsed() < MAX_SETTLE && self.ready(SETTLE) {
            self.drain(&mut woken);
        }
        match woken {
            // Only watches dropped: nothing to list.
            Woken::Dirs(d) if d.is_empty() => Woken::Timeout,
            other => other,
        }
    }

    /// Whether events are there to read, waiting up to `timeout`.
    fn ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = Timespec::try_from(left).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(n) => return n > 0,
                Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
                Err(e) => {
                    // Should not happen; fall back to the interval.
                    tracing::warn!("waiting for directory events: {e}");
                    std::thread::sleep(left);
                    return false;
                }
            }
        }
    }

    /// Reads every pending event into `woken`; forgets the watches the
    /// kernel dropped.
    fn drain(&mut self, woken: &mut Woken) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut dropped = Vec::new();
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(rustix::io::Errno::INTR) => continue,
                // WOULDBLOCK: all read. Anything else: list everything.
                Err(rustix::io::Errno::WOULDBLOCK) => break,
                Err(_) => {
                    *woken = Woken::Everything;
                    break;
                }
            };
            let flags = ev.events();
            // The directory was removed (or its file system unmounted):
            // its watch is gone. Its parent's event says what to list.
            if flags.contains(ReadFlags::IGNORED) {
                dropped.push(ev.wd());
                continue;
            }
            let Woken::Dirs(dirs) = woken else { continue };
            let place = self.by_wd.get(&ev.wd());
            let everything = flags.intersects(ReadFlags::QUEUE_OVERFLOW | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
            match (place, everything) {
                (Some(dir), false) => match ev.file_name() {
                    Some(name) if flags.contains(ReadFlags::ISDIR) => {
                        let sub = dir.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
                        dirs.insert(sub, true);
                    }
                    _ => {
                        dirs.entry(dir.clone()).or_insert(false);
                    }
                },
                _ => *woken = Woken::Everything,
            }
        }
        if !dropped.is_empty() {
            self.dirs.retain(|_, (_, wd)| !dropped.contains(wd));
            for wd in dropped {
                self.by_wd.remove(&wd);
            }
        }
    }
}
