//! A directory's changes as a wake-up (inotify): a process that reads
//! files another one writes (the node proxy the node agent's pod list, the
//! agent the proxy's report) learns of a new version at once instead of at
//! its next poll. What changed is not read: the caller reads its files
//! again, and keeps its poll as the fallback (an inotify limit reached, a
//! file system without it).

use std::io;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Notify;

/// The watch: a thread blocked reading the inotify descriptor wakes
/// [`DirWatch::changed`] (a blocking thread rather than the runtime's
/// reactor, which registers a raw descriptor only unsafely).
pub struct DirWatch {
    changed: Arc<Notify>,
}

impl DirWatch {
    /// Watches `dir` for files written, moved in (a rename over a file) or
    /// removed.
    pub fn new(dir: &Path) -> io::Result<DirWatch> {
        use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
        let fd = inotify::init(CreateFlags::CLOEXEC)?;
        inotify::add_watch(&fd, dir, WatchFlags::CLOSE_WRITE | WatchFlags::MOVED_TO | WatchFlags::CREATE | WatchFlags::DELETE)?;
        let changed = Arc::new(Notify::new());
        let theirs = Arc::downgrade(&changed);
        std::thread::Builder::new().name("dirwatch".into()).spawn(move || {
            let mut buf = [0u8; 4096];
            // Until the watch is dropped (noticed at the next event). A
            // removed directory sends no more events: its reader keeps
            // its poll, the fallback.
            while rustix::io::read(&fd, &mut buf).is_ok() {
                match theirs.upgrade() {
                    // A permit is kept when no one waits: no change is lost.
                    Some(n) => n.notify_one(),
                    None => return,
                }
            }
        })?;
        Ok(DirWatch { changed })
    }

    /// Returns once something in the directory changed since the last
    /// call (the changes meanwhile are taken as one).
    pub async fn changed(&self) -> io::Result<()> {
        self.changed.notified().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::DirWatch;
    use std::time::Duration;

    #[tokio::test]
    async fn a_rename_into_the_directory_wakes_it_and_quiet_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let w = DirWatch::new(dir.path()).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(100), w.changed()).await.is_err(), "nothing changed yet");
        std::fs::write(dir.path().join("pods.json.tmp"), b"{}").unwrap();
        std::fs::rename(dir.path().join("pods.json.tmp"), dir.path().join("pods.json")).unwrap();
        tokio::time::timeout(Duration::from_secs(2), w.changed()).await.expect("woken").unwrap();
        // The rest of that write's events (read in one go or not), then quiet.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = tokio::time::timeout(Duration::from_millis(10), w.changed()).await;
        assert!(tokio::time::timeout(Duration::from_millis(100), w.changed()).await.is_err(), "no wake-up without a change");
    }
}
