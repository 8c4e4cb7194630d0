//! etcd and kube-apiserver as child processes that cannot outlive the test:
//! each in a process group of its own, which `Drop` kills and reaps, and
//! with a parent-death signal, so that a test process killed outright
//! (Ctrl-C, a harness timeout, an abort) takes them down too.

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;

use anyhow::Context;
use rustix::process::{kill_process_group, Pid, Signal};

/// How many lines of a log an error quotes.
pub const LOG_TAIL_LINES: usize = 30;

pub struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program` with stdout and stderr appended to `log`.
    pub fn spawn(name: &'static str, program: &Path, args: &[String], log: PathBuf) -> anyhow::Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = match setpriv() {
            // setpriv(1) sets PR_SET_PDEATHSIG and execs the program, so no
            // unsafe pre_exec hook is needed here.
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
                cmd
            }
            None => {
                eprintln!("kubetest: WARNING: setpriv (util-linux) not found: {name} will outlive this process if it is killed");
                Command::new(program)
            }
        };
        cmd.args(args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
        let child = spawn_from_a_lasting_thread(cmd).with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self { name, child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error, quoting the end of the log, if the process has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!("{} exited ({status}){}", self.name, self.log_tail()),
        }
    }

    /// The last lines of the log, introduced by where the log is.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(unreadable: {e})"));
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("; last {LOG_TAIL_LINES} lines of {}:\n{tail}", self.log.display())
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // Only a child not yet reaped still owns its process group id; one
        // that was reaped may have had it reused by now.
        if let Ok(None) = self.child.try_wait() {
            // Nothing to preserve: the data lives in a directory about to
            // be removed, so no graceful shutdown.
            let _ = kill_process_group(Pid::from_child(&self.child), Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

fn setpriv() -> Option<&'static Path> {
    ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().map(Path::new).find(|p| p.exists())
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Linux sends the parent-death signal when the *thread* that forked the
/// child exits, not the process. Tests spawn from runtime threads that come
/// and go (and a server kept in a static outlives the test that started it),
/// so every child is forked by one thread that lives as long as the process.
fn spawn_from_a_lasting_thread(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("kubetest-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("kubetest: cannot start the thread that spawns etcd and kube-apiserver");
        tx
    });
    let (reply, answer) = mpsc::channel();
    let gone = || io::Error::other("kubetest: the spawner thread is gone");
    spawner.send((cmd, reply)).map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}
