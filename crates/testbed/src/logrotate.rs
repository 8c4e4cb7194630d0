//! The local cluster's log files rotated as the kubelet rotates container
//! logs (`containerLogMaxSize` 10 MiB, `containerLogMaxFiles` 5): past
//! [`MAX_BYTES`] a log is copied to `NAME.1` (the older copies moved to
//! `NAME.2` .. `NAME.4`, the oldest dropped) and emptied. Without it a
//! waypoint's access log under load grows by about 300 bytes a request,
//! 300 MB in a few minutes of a benchmark.
//!
//! The writers keep their descriptor (opened with `O_APPEND`, so after the
//! truncation they write at the new end): this is logrotate's
//! `copytruncate`, since a pod's process cannot be told to reopen its
//! stderr. Lines written between the copy and the truncation are lost; at
//! 10 MiB per rotation that is at most a few lines in millions. The copy
//! keeps at most the last 20 MiB (from a whole line): a pod that writes faster than
//! the agent looks loses its oldest lines rather than making the agent copy
//! all it wrote. What it writes between two checks still lands on disk
//! first, as with the kubelet. `slipstream logs` shows the current file, as
//! `kubectl logs` does.

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A log is rotated once it is this large.
pub const MAX_BYTES: u64 = 10 << 20;
/// Rotated copies kept besides the current file.
pub const KEEP: usize = 4;
/// How often the agent looks at the sizes.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// `NAME.n`.
pub fn numbered(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Rotates `path` when it has reached `max` bytes; whether it did.
pub fn rotate_if_large(path: &Path, max: u64, keep: usize) -> io::Result<bool> {
    let len = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len < max || keep == 0 {
        return Ok(false);
    }
    for n in (1..keep).rev() {
        let from = numbered(path, n);
        if from.exists() {
            fs::rename(&from, numbered(path, n + 1))?;
        }
    }
    copy_tail(path, &numbered(path, 1), max.saturating_mul(2))?;
    OpenOptions::new().write(true).open(path)?.set_len(0)?;
    Ok(true)
}

/// Copies the last `max` bytes of `from` (from the first whole line in
/// them) to `to`. A pod that floods its stdout between two checks makes
/// the agent copy at most `max` bytes, never the whole flood; a log found
/// a little past the size (the usual case) is copied whole.
fn copy_tail(from: &Path, to: &Path, max: u64) -> io::Result<()> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let mut src = fs::File::open(from)?;
    let start = src.metadata()?.len().saturating_sub(max);
    src.seek(SeekFrom::Start(start))?;
    let mut src = io::BufReader::new(src).take(max);
    if start > 0 {
        src.read_until(b'\n', &mut Vec::new())?;
    }
    io::copy(&mut src, &mut fs::File::create(to)?)?;
    Ok(())
}

/// The `*.log` files directly in `dir` and in its subdirectories down to
/// `depth` levels (the pods' logs are `pods/NS/POD/CONTAINER.log`).
pub fn logs_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() && depth > 0 => logs_under(&p, depth - 1, out),
            Ok(t) if t.is_file() && p.extension().is_some_and(|x| x == "log") => out.push(p),
            _ => {}
        }
    }
}

/// The rotation of one cluster's logs: every [`CHECK_EVERY`], each log
/// under the state directory past [`MAX_BYTES`] is rotated.
pub struct Rotation {
    next_check: std::time::Instant,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation { next_check: std::time::Instant::now() }
    }
}

impl Rotation {
    /// Rotates the logs under `state_dir` that grew too large, when a check
    /// is due.
    pub fn tick(&mut self, state_dir: &Path) {
        let now = std::time::Instant::now();
        if now < self.next_check {
            return;
        }
        self.next_check = now + CHECK_EVERY;
        let mut logs = Vec::new();
        logs_under(state_dir, 3, &mut logs);
        for log in logs {
            match rotate_if_large(&log, MAX_BYTES, KEEP) {
                Ok(true) => tracing::info!(log = %log.display(), "log rotated: copied to .1 and emptied (10 MiB reached; 4 copies kept)"),
                Ok(false) => {}
                Err(e) => tracing::warn!(log = %log.display(), "rotating the log: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_large_log_is_copied_and_emptied_and_its_writer_goes_on_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("c.log");
        let mut writer = OpenOptions::new().create(true).append(true).open(&log).unwrap();
        writer.write_all(&[b'a'; 100]).unwrap();
        assert!(!rotate_if_large(&log, 101, 2).unwrap(), "under the size: left alone");
        writer.write_all(b"b").unwrap();
        assert!(rotate_if_large(&log, 101, 2).unwrap());
        assert_eq!(fs::read(numbered(&log, 1)).unwrap().len(), 101);
        writer.write_all(b"next line\n").unwrap();
        assert_eq!(fs::read(&log).unwrap(), b"next line\n", "the writer appends at the new end, no hole");

        // Older copies move up; past KEEP they are dropped.
        fs::write(&log, [b'x'; 200]).unwrap();
        assert!(rotate_if_large(&log, 101, 2).unwrap());
        assert_eq!(fs::read(numbered(&log, 2)).unwrap().len(), 101);
        assert_eq!(fs::read(numbered(&log, 1)).unwrap(), [b'x'; 200]);
        fs::write(&log, [b'y'; 300]).unwrap();
        assert!(rotate_if_large(&log, 101, 2).unwrap());
        assert_eq!(fs::read(numbered(&log, 2)).unwrap(), [b'x'; 200], "the oldest copy was dropped");
        assert!(!numbered(&log, 3).exists());
        assert!(!rotate_if_large(&dir.path().join("absent.log"), 1, 2).unwrap());
    }

    #[test]
    fn a_flood_past_the_size_keeps_only_its_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("c.log");
        let lines: String = (0..100).map(|i| format!("line {i:03}\n")).collect();
        fs::write(&log, &lines).unwrap();
        assert!(rotate_if_large(&log, 25, 1).unwrap());
        let kept = "line 095\nline 096\nline 097\nline 098\nline 099\n";
        assert_eq!(fs::read_to_string(numbered(&log, 1)).unwrap(), kept, "the last 50 bytes (twice the size), from a whole line");
        assert_eq!(fs::read(&log).unwrap().len(), 0);
    }

    #[test]
    fn finds_the_logs_of_pods_and_processes() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pods/ns/p")).unwrap();
        fs::create_dir_all(dir.path().join("nodes")).unwrap();
        for f in ["agent.log", "pods/ns/p/c.log", "pods/ns/p/c.log.1", "nodes/node1.log", "objects.json"] {
            fs::write(dir.path().join(f), "").unwrap();
        }
        let mut found = Vec::new();
        logs_under(dir.path(), 3, &mut found);
        found.sort();
        let rel: Vec<_> = found.iter().map(|p| p.strip_prefix(dir.path()).unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(rel, ["agent.log", "nodes/node1.log", "pods/ns/p/c.log"]);
    }
}
