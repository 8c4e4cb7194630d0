//! Starting a process inside a pod: its cgroup, its network namespace, a
//! private mount namespace with the pod's hosts and resolv.conf, its host
//! name. Everything is prepared before fork; the pre-exec closure only makes
//! async-signal-safe system calls.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub netns: PathBuf,
    pub cgroup: PathBuf,
    pub hostname: String,
    /// Files bind-mounted over /etc/hosts and /etc/resolv.conf.
    pub hosts: Option<PathBuf>,
    pub resolv: Option<PathBuf>,
    /// Append stdout+stderr here; None inherits the caller's (for `exec`).
    pub log: Option<PathBuf>,
    /// Own session (pods) or stay in the caller's (interactive `exec`, so
    /// that Ctrl-C reaches the command).
    pub new_session: bool,
    /// A private mount and UTS namespace (pods). The node proxy shares the
    /// host's, so that network namespaces created later under /run/netns
    /// stay visible to it.
    pub private_mounts: bool,
}

struct Prepared {
    netns: File,
    cgroup_procs: File,
    mounts: Vec<(CString, CString)>,
    hostname: CString,
    root: CString,
    new_session: bool,
    private_mounts: bool,
}

pub fn spawn(spec: &SandboxSpec) -> io::Result<Child> {
    let ctx = |what: &str, p: &std::path::Path| {
        let p = p.display().to_string();
        let what = what.to_string();
        move |e: io::Error| io::Error::new(e.kind(), format!("{what} {p}: {e}"))
    };
    let prepared = Prepared {
        netns: File::open(&spec.netns).map_err(ctx("cannot open network namespace", &spec.netns))?,
        cgroup_procs: OpenOptions::new()
            .write(true)
            .open(spec.cgroup.join("cgroup.procs"))
            .map_err(ctx("cannot open cgroup", &spec.cgroup))?,
        mounts: [(spec.hosts.as_ref(), "/etc/hosts"), (spec.resolv.as_ref(), "/etc/resolv.conf")]
            .into_iter()
            .filter_map(|(src, dst)| {
                let src = src?;
                // A missing target cannot be bind-mounted over; skip it.
                std::path::Path::new(dst).exists().then(|| (cstr(src.as_os_str().as_encoded_bytes()), cstr(dst.as_bytes())))
            })
            .collect(),
        hostname: cstr(spec.hostname.as_bytes()),
        root: cstr(b"/"),
        new_session: spec.new_session,
        private_mounts: spec.private_mounts,
    };
    let program = resolve_program(&spec.argv[0]);
    let mut cmd = Command::new(&program);
    cmd.args(&spec.argv[1..]).env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    if let Some(log) = &spec.log {
        let f = OpenOptions::new().create(true).append(true).open(log).map_err(ctx("cannot open log", log))?;
        cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    }
    // SAFETY: the closure calls only async-signal-safe functions (write,
    // setns, unshare, mount, sethostname, setsid) on data prepared above.
    unsafe {
        cmd.pre_exec(move || enter(&prepared));
    }
    cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("cannot start {}: {e}", spec.argv[0])))
}

fn enter(p: &Prepared) -> io::Result<()> {
    let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    // SAFETY (whole function): plain system calls on valid fds and
    // NUL-terminated strings that outlive the calls.
    unsafe {
        // "0" moves the writing process itself into the cgroup.
        if libc::write(p.cgroup_procs.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
            return Err(io::Error::last_os_error());
        }
        check(libc::setns(p.netns.as_raw_fd(), libc::CLONE_NEWNET))?;
        if p.private_mounts {
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            // Keep our bind mounts from propagating back to the host.
            check(libc::mount(std::ptr::null(), p.root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
            for (src, dst) in &p.mounts {
                check(libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
            }
            check(libc::sethostname(p.hostname.as_ptr(), p.hostname.as_bytes().len()))?;
        }
        if p.new_session && libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn cstr(b: &[u8]) -> CString {
    CString::new(b.to_vec()).unwrap_or_else(|_| CString::new("/nonexistent").expect("static"))
}

/// `slipstream` in a pod's command means this very binary, so manifests work
/// whether or not it is installed on PATH.
pub fn resolve_program(p: &str) -> PathBuf {
    if p == "slipstream" {
        if let Ok(exe) = std::env::current_exe() {
            return exe;
        }
    }
    PathBuf::from(p)
}

/// PATH for pod processes: this binary's directory first, then the usual.
pub fn pod_path() -> String {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::current_exe().ok().and_then(|e| e.parent().map(|p| p.display().to_string())) {
        dirs.push(d);
    }
    dirs.extend(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(String::from));
    if let Ok(home) = std::env::var("HOME") {
        dirs.push(format!("{home}/go/bin"));
    }
    dirs.join(":")
}

/// Starts a long-lived background process (the agent) in its own session,
/// detached from the caller's terminal, with output appended to `log`.
pub fn spawn_daemon(argv: &[String], log: &std::path::Path) -> io::Result<Child> {
    let f = OpenOptions::new().create(true).append(true).open(log)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| if libc::setsid() < 0 { Err(io::Error::last_os_error()) } else { Ok(()) });
    }
    cmd.spawn()
}
