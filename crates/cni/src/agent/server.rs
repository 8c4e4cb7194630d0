//! The agent's socket, where the CNI plugin asks (`crate::plugin`): one
//! JSON request line, one answer line. ADD records the pod's sandbox, wakes
//! the pass and answers once the pass says the pod is meshed (or is not to
//! be); DEL forgets the sandbox and answers at once.

use super::pass::{Answer, Sandbox};
use crate::protocol::{Command, Reply, Request};
use slipstream_core::sync::LockExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How long an ADD waits for its pod (the plugin waits a little longer).
const ADD_WAIT: Duration = Duration::from_secs(45);

/// What the socket and the pass share.
#[derive(Debug, Default)]
pub struct Board {
    pub sandboxes: BTreeMap<String, Sandbox>,
    pub answers: BTreeMap<String, Answer>,
    /// Bumped by every pass as it takes its copy of the sandboxes.
    pub started: u64,
    /// The `started` of the pass whose answers these are: an ADD counts
    /// only answers of a pass that started after its sandbox was recorded
    /// (one that started before never saw it, and could answer for the
    /// pod's previous sandbox).
    pub answered: u64,
    /// Told after every pass: a waiting ADD looks at its answer at once.
    pub passed: Arc<tokio::sync::Notify>,
}

pub type Shared = Arc<Mutex<Board>>;

/// Serves the socket until the task is dropped.
pub async fn serve(listener: UnixListener, board: Shared, wake: std::sync::mpsc::Sender<()>) {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                tokio::spawn(one(s, board.clone(), wake.clone()));
            }
            Err(e) => {
                tracing::warn!("CNI socket: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Binds the socket at `path` (a stale one from a previous agent removed),
/// readable and writable by root only.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

async fn one(s: UnixStream, board: Shared, wake: std::sync::mpsc::Sender<()>) {
    let (r, mut w) = s.into_split();
    let mut line = String::new();
    if BufReader::new(r).read_line(&mut line).await.is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(req) => handle(req, &board, &wake).await,
        Err(e) => Reply::refused(format!("request not understood: {e}")),
    };
    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
    out.push(b'\n');
    let _ = w.write_all(&out).await;
}

async fn handle(req: Request, board: &Shared, wake: &std::sync::mpsc::Sender<()>) -> Reply {
    let key = format!("{}/{}", req.namespace, req.name);
    match req.command {
        Command::Del => {
            let mut b = board.locked();
            if b.sandboxes.get(&key).is_some_and(|sb| req.netns.is_empty() || sb.netns.as_os_str() == req.netns.as_str()) {
                b.sandboxes.remove(&key);
            }
            drop(b);
            let _ = wake.send(());
            tracing::info!(pod = %key, "CNI DEL");
            Reply::ok("released")
        }
        Command::Add => {
            let started = tokio::time::Instant::now();
            let since = {
                let mut b = board.locked();
                b.sandboxes.insert(key.clone(), Sandbox { uid: req.uid.clone(), netns: req.netns.clone().into(), ips: req.ips.clone() });
                b.answers.remove(&key);
                b.started
            };
            let passed = board.locked().passed.clone();
            let _ = wake.send(());
            loop {
                // Registered before the answer is looked at, so that a pass
                // ending in between still wakes this loop.
                let next_pass = passed.notified();
                tokio::pin!(next_pass);
                next_pass.as_mut().enable();
                let answer = {
                    let b = board.locked();
                    // Only a pass that started after this ADD counts.
                    if b.answered > since {
                        b.answers.get(&key).cloned()
                    } else {
                        None
                    }
                };
                match answer {
                    Some(Answer::Meshed) => {
                        tracing::info!(pod = %key, waited = ?started.elapsed(), "CNI ADD: meshed before its first container starts");
                        return Reply::ok("meshed");
                    }
                    Some(Answer::NotMeshed) => return Reply::ok("not meshed"),
                    other if started.elapsed() > ADD_WAIT => {
                        let why = match other {
                            Some(Answer::Waiting(why)) => why,
                            _ => "the pod is not in the agent's view of the API server (is the watch failing? see the agent's log)".into(),
                        };
                        tracing::warn!(pod = %key, "CNI ADD refused after {ADD_WAIT:?}: {why}");
                        return Reply::refused(format!("not meshed within {ADD_WAIT:?}: {why}"));
                    }
                    _ => {
                        tokio::select! {
                            _ = next_pass => {}
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                }
            }
        }
    }
}
