//! `slipstream pod-init`: the small init every confined pod process runs
//! under, so that it gets its own PID namespace (as a container runtime
//! gives each container). The agent (or `exec`) starts it through
//! `spawn::spawn_confined`, whose pre-exec step already put it in the pod's
//! cgroup, network, mount and UTS namespaces, hid the machine's files, made a
//! minimal /dev and unshared (or joined) the PID namespace for its children.
//! Then:
//!
//! ```text
//! pod-init (host PID namespace: the pid `status` shows, the agent's child)
//!  ├── PID 1 of the new namespace: reaps orphans, nothing else (not when joining)
//!  └── the command (PID 2): fresh /proc, confinement applied, exec
//! ```
//!
//! The command is pod-init's own child, so pod-init sees its exact exit
//! status and exits with it (128+N when killed by signal N). The command is
//! not PID 1: a PID 1 ignores SIGTERM unless it handles it, and the agent's
//! graceful stop must stop `sleep infinity` at once, as it did before. PID 1
//! and the command die with pod-init (PR_SET_PDEATHSIG), and everything left
//! in the namespace dies with PID 1, so killing pod-init kills the container.
//!
//! System calls go through rustix, except what rustix offers only to
//! programs that run without libc (`rustix::runtime`), which stays libc:
//! fork(2), the signal mask (sigprocmask, sigwaitinfo and the sigset
//! operations) and _exit(2) in the forked reaper and the pre-exec step.
#![allow(unsafe_code)]

use super::spawn::{drop_credentials, Confinement, InitSpec};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::FdFlags;
use rustix::mount::{mount, mount_bind, mount_bind_recursive, mount_remount, MountFlags};
use rustix::process::{kill_process, set_dumpable_behavior, set_parent_process_death_signal, DumpableBehavior, Pid, Signal, WaitOptions};
use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Signals pod-init passes on to the command.
pub const FORWARDED: [libc::c_int; 6] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];

/// Whether a signal pod-init received should be passed on to the command
/// (pure). Not when the command got it too: from the kernel (a terminal's
/// Ctrl-C reaches the whole process group) or from one of `signallers`:
/// pod-init's parent and the agent, which stops a pod by signalling every
/// process of its cgroup (for an `exec`, the parent is the CLI and the agent
/// is named apart). Anyone else (`kill <pid from status>`) signalled
/// pod-init alone.
pub fn forward(sig: libc::c_int, si_code: libc::c_int, sender: libc::pid_t, signallers: &[libc::pid_t]) -> bool {
    FORWARDED.contains(&sig) && si_code != libc::SI_KERNEL && !(si_code == libc::SI_USER && signallers.contains(&sender))
}

/// /proc entries a confined command must not write (read-only) or read
/// (covered), as runc masks them: the kernel's sysctls, the SysRq trigger
/// (which reboots the machine), interrupt and bus settings; kernel memory,
/// keys and timers.
const PROC_READ_ONLY: [&str; 5] = ["/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq"];
const PROC_MASKED: [&str; 8] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/timer_stats",
    "/proc/acpi",
    "/proc/scsi",
];

/// Everything the command's pre-exec step needs, prepared before fork.
struct CommandSetup {
    confinement: Confinement,
    last_cap: u32,
    /// Cover /proc's sensitive entries (false for privileged containers).
    mask: bool,
    proc_: CString,
    proc_type: CString,
    proc_read_only: Vec<CString>,
    masked_files: Vec<CString>,
    masked_dirs: Vec<CString>,
    dev_null: CString,
    tmpfs: CString,
    tmpfs_data: CString,
    life: RawFd,
}

fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

/// Runs pod-init: never returns. `spec` is `InitSpec` as JSON, `argv` the
/// command. Must run before this process starts any other (its first child
/// becomes PID 1 of the new namespace).
pub fn main(spec: &str, argv: &[String]) -> ! {
    // First: it runs as root with every capability for the container's
    // life, so a root pod must not read its memory or reach its files
    // through /proc/PID (the reaper, forked below, inherits this; the
    // command's exec makes it dumpable again, as it should be).
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        fail(None, &format!("pod-init: cannot become non-dumpable: {}", io::Error::from(e)));
    }
    let spec: InitSpec = match serde_json::from_str::<InitSpec>(spec) {
        Ok(s) if s.status_fd < 0 => fail(None, &format!("pod-init: bad --spec: status fd {}", s.status_fd)),
        Ok(s) => s,
        Err(e) => fail(None, &format!("pod-init: bad --spec: {e}")),
    };
    // The command must not inherit it.
    // SAFETY: the status pipe's write end, which `spawn_confined` left open
    // across exec for us; not -1 (checked above).
    let _ = rustix::io::fcntl_setfd(unsafe { BorrowedFd::borrow_raw(spec.status_fd) }, FdFlags::CLOEXEC);
    let status = Some(spec.status_fd);
    if argv.is_empty() {
        fail(status, "pod-init: no command");
    }
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(caps::Capability::CAP_CHECKPOINT_RESTORE.index() as u32);
    let exists = |p: &str| std::path::Path::new(p).exists();
    let is_dir = |p: &str| std::path::Path::new(p).is_dir();
    // The life pipe: its write end is held by this process only, so the
    // children see it hang up once we are gone (closing the race before
    // their PR_SET_PDEATHSIG).
    // Raw: both ends live as long as the processes that hold them.
    let (life_r, life_w) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok((r, w)) => (r.into_raw_fd(), w.into_raw_fd()),
        Err(e) => fail(status, &format!("pod-init: pipe: {}", io::Error::from(e))),
    };
    let setup = CommandSetup {
        mask: spec.confinement.hide_host,
        confinement: spec.confinement,
        last_cap,
        proc_: c("/proc"),
        proc_type: c("proc"),
        proc_read_only: PROC_READ_ONLY.into_iter().filter(|p| exists(p)).map(c).collect(),
        masked_files: PROC_MASKED.into_iter().filter(|p| exists(p) && !is_dir(p)).map(c).collect(),
        masked_dirs: PROC_MASKED.into_iter().filter(|p| is_dir(p)).map(c).collect(),
        dev_null: c("/dev/null"),
        tmpfs: c("tmpfs"),
        tmpfs_data: c("size=4k,mode=555"),
        life: life_r,
    };

    // Block what we wait for before any child exists, so nothing is lost.
    // SAFETY: sigset operations on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };

    let init = if spec.new_pid_ns {
        // SAFETY: this process is single-threaded here; the child only
        // makes system calls before it loops in `reaper`.
        match unsafe { libc::fork() } {
            -1 => fail(status, &format!("pod-init: fork: {}", io::Error::last_os_error())),
            // SAFETY: the new child, single-threaded as this process was.
            0 => unsafe { reaper(spec.status_fd, life_r, life_w) },
            pid => Pid::from_raw(pid),
        }
    } else {
        None
    };

    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    // SAFETY: the closure makes only async-signal-safe system calls on data
    // prepared above.
    unsafe {
        cmd.pre_exec(move || enter_command(&setup, life_w));
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            if let Some(init) = init {
                let _ = kill_process(init, Signal::KILL);
                let _ = rustix::process::waitpid(Some(init), WaitOptions::empty());
            }
            fail(status, &format!("cannot start {}: {e}", argv[0]));
        }
    };
    // Closing it empty tells the caller the command runs.
    // SAFETY: the fd is ours, and not used again.
    unsafe { rustix::io::close(spec.status_fd) };
    let pid = Pid::from_child(&child);
    let mut signallers = vec![std::os::unix::process::parent_id() as libc::pid_t];
    signallers.extend(spec.cgroup_signaller);

    loop {
        // SAFETY: sigwaitinfo fills `info`; si_pid is read for a signal
        // sent by a process (SI_USER), where it is set.
        let (sig, code, sender) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigwaitinfo(&set, &mut info);
            (sig, info.si_code, if sig > 0 { info.si_pid() } else { 0 })
        };
        if sig == libc::SIGCHLD {
            if let Ok(Some(st)) = child.try_wait() {
                if let Some(init) = init {
                    // Ends the namespace: whatever the command left is killed.
                    let _ = kill_process(init, Signal::KILL);
                    let _ = rustix::process::waitpid(Some(init), WaitOptions::empty());
                }
                std::process::exit(super::signals::exit_code(st));
            }
        } else if sig > 0 && forward(sig, code, sender, &signallers) {
            // Our own child, not yet reaped; every forwarded signal is named.
            if let Some(sig) = Signal::from_named_raw(sig) {
                let _ = kill_process(pid, sig);
            }
        }
    }
}

/// Reports `msg` on the status fd (or stderr) and exits 127.
fn fail(status: Option<RawFd>, msg: &str) -> ! {
    match status {
        Some(fd) => {
            // SAFETY: the fd is ours and used once; File closes it.
            let _ = unsafe { std::fs::File::from_raw_fd(fd) }.write_all(msg.as_bytes());
        }
        None => eprintln!("{msg}"),
    }
    std::process::exit(127)
}

/// Exits if pod-init is gone (the life pipe hung up). Async-signal-safe.
fn exit_if_orphaned(life: RawFd) {
    // SAFETY: the life pipe's read end, open in this process for its life.
    let life = unsafe { BorrowedFd::borrow_raw(life) };
    let mut p = [PollFd::new(&life, PollFlags::IN)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    if rustix::event::poll(&mut p, Some(&now)).unwrap_or(0) != 0 && p[0].revents().contains(PollFlags::HUP) {
        // SAFETY: _exit(2) ends the process at once, which is the point.
        unsafe { libc::_exit(137) };
    }
}

/// PID 1 of the pod's namespace: reaps every orphan until pod-init kills it
/// (or dies: PR_SET_PDEATHSIG). Holds no capability and is not dumpable
/// (inherited from pod-init): a pod cannot use it for anything. Signals from inside the namespace do
/// not reach it (a PID 1 without handlers ignores them, SIGKILL included).
///
/// # Safety
/// Only in the child of a fork, which owns the three fds.
unsafe fn reaper(status_fd: RawFd, life_r: RawFd, life_w: RawFd) -> ! {
    rustix::io::close(status_fd);
    rustix::io::close(life_w);
    let _ = set_parent_process_death_signal(Some(Signal::KILL));
    exit_if_orphaned(life_r);
    // Drop every capability (it only waits). The bounding set and uid stay:
    // they do not matter to a process that never execs.
    let none = rustix::thread::CapabilitySet::empty();
    let _ = rustix::thread::set_capabilities(None, rustix::thread::CapabilitySets { effective: none, permitted: none, inheritable: none });
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, libc::SIGCHLD);
    loop {
        while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        // SIGCHLD stays blocked (inherited), so one arriving between the
        // loop above and this wait is pending and ends it at once.
        libc::sigwaitinfo(&set, std::ptr::null_mut());
    }
}

/// The command's pre-exec step, in the new (or joined) PID namespace: a
/// /proc of that namespace, its sensitive entries covered, then the
/// container's credentials. Async-signal-safe.
fn enter_command(s: &CommandSetup, life_w: RawFd) -> io::Result<()> {
    let locked = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    // SAFETY: this child's copy of the life pipe's write end, not used again;
    // then the signal mask, on a local set.
    unsafe {
        rustix::io::close(life_w);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
    // A fresh procfs shows the mounting process's PID namespace. It goes
    // over the machine's /proc in the container's own mount namespace.
    mount(s.proc_type.as_c_str(), s.proc_.as_c_str(), s.proc_type.as_c_str(), locked, None)?;
    if s.mask {
        for p in &s.proc_read_only {
            mount_bind_recursive(p.as_c_str(), p.as_c_str())?;
            mount_remount(p.as_c_str(), MountFlags::BIND | MountFlags::RDONLY | locked, c"")?;
        }
        for p in &s.masked_files {
            mount_bind(s.dev_null.as_c_str(), p.as_c_str())?;
        }
        for p in &s.masked_dirs {
            mount(s.tmpfs.as_c_str(), p.as_c_str(), s.tmpfs.as_c_str(), MountFlags::RDONLY | locked, Some(s.tmpfs_data.as_c_str()))?;
        }
    }
    drop_credentials(&s.confinement, s.last_cap)?;
    // After the credentials: changing the uid clears it.
    set_parent_process_death_signal(Some(Signal::KILL))?;
    exit_if_orphaned(s.life);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_only_what_the_command_did_not_get_too() {
        let (parent, agent) = (100, 200);
        // (signal, si_code, sender, forwarded)
        let cases = [
            // `kill -TERM <pod-init pid>` by someone else: only pod-init got it.
            (libc::SIGTERM, libc::SI_USER, 555, true),
            (libc::SIGUSR1, libc::SI_QUEUE, 555, true),
            (libc::SIGHUP, libc::SI_TKILL, 555, true),
            // The agent signals the whole cgroup: the command has it already,
            // whether the agent is pod-init's parent or an `exec`'s CLI is.
            (libc::SIGTERM, libc::SI_USER, parent, false),
            (libc::SIGTERM, libc::SI_USER, agent, false),
            // Ctrl-C on a terminal: the kernel signals the process group.
            (libc::SIGINT, libc::SI_KERNEL, 0, false),
            // Not a forwarded signal.
            (libc::SIGCHLD, libc::SI_USER, 555, false),
            (libc::SIGWINCH, libc::SI_USER, 555, false),
        ];
        for (sig, code, sender, want) in cases {
            assert_eq!(forward(sig, code, sender, &[parent, agent]), want, "signal {sig} code {code} from {sender}");
        }
    }

    #[test]
    fn spec_round_trips_as_json() {
        let spec = InitSpec {
            confinement: super::super::spawn::confinement(&slipstream_k8s::ContainerSecurity {
                uid: 1000,
                gid: 1000,
                ..Default::default()
            }),
            new_pid_ns: true,
            status_fd: 5,
            cgroup_signaller: Some(42),
        };
        let back: InitSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }
}
