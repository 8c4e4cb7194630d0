//! Starting a process inside a pod: its cgroup, its network namespace, a
//! private mount namespace with the pod's hosts and resolv.conf, its host
//! name, and its confinement (every mount of the machine read-only, the
//! cluster's files and the operator's CA key hidden, private /tmp, /var/tmp
//! and /run, a minimal /dev, its own PID namespace; user, groups,
//! capabilities and no_new_privs, applied by `podinit` last before the
//! command runs). Everything is prepared before fork; the pre-exec closure
//! only makes async-signal-safe system calls.
//!
//! System calls go through rustix (raw system calls: async-signal-safe, no
//! allocation with the `CStr` paths prepared here), except two that stay
//! libc: mount_setattr(2), which rustix does not have, and the credentials
//! (setgroups, setgid, setuid), whose rustix forms change the calling thread
//! only and take `Gid`s that would have to be built before fork; libc's
//! change the whole process, as POSIX says.
#![allow(unsafe_code)]

mod confine;

pub use confine::{
    confinement, in_cgroup, read_only_mounts, under_private_dir, Confinement, PidNamespace, DEFAULT_CAPS, DEVICES, DEV_LINKS, PRIVATE_DIRS,
};
use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use rustix::fs::{Dev, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{mount, mount_bind, mount_remount, MountFlags, MountPropagationFlags};
use rustix::thread::{CapabilitySet, CapabilitySets, LinkNameSpaceType, UnshareFlags};

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
    /// Files a confined process must not read although the rest of the
    /// machine's files stay readable: each is covered with an empty file
    /// (/dev/null, as runc masks paths). The operator's `--ca-key`, which
    /// the agent copied into the cluster's (hidden) state.
    pub masked_files: Vec<PathBuf>,
    /// The process that stops a pod by signalling every process of its
    /// cgroup (the agent): pod-init does not pass its signals on, the
    /// command got them already. pod-init's parent never needs naming.
    pub cgroup_signaller: Option<i32>,
}

/// Confinement data ready for the pre-exec closure.
struct PreparedConfinement {
    c: Confinement,
    hide: Vec<CString>,
    masked: Vec<CString>,
    dev_null: CString,
    /// Every mount, for kernels without mount_setattr.
    read_only: Vec<(CString, MountFlags)>,
    root_flags: MountFlags,
    private: Vec<(CString, CString)>,
    /// This binary, when it lives under a private directory (a build in
    /// /var/tmp): pods run it (`slipstream app ...`, PATH), so it stays
    /// there, read-only.
    keep_exe: Option<KeptFile>,
    tmpfs: CString,
    tmpfs_data: CString,
    dev: PreparedDev,
}

/// A file put back, read-only, inside a private tmpfs that covers it.
struct KeptFile {
    /// Its number names it in `source` (/proc/self/fd/N); the pre-exec step
    /// reopens the file under that number.
    fd: OwnedFd,
    source: CString,
    /// The directories to make in the tmpfs, parents first, then the file.
    dirs: Vec<CString>,
    path: CString,
}

fn keep_exe() -> io::Result<Option<KeptFile>> {
    let Ok(exe) = std::env::current_exe() else { return Ok(None) };
    let Some(dir) = under_private_dir(&exe) else { return Ok(None) };
    let fd = rustix::fs::open(&exe, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    let dirs = exe
        .ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(dir) && *a != std::path::Path::new(dir))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(|a| cstr(a.as_os_str().as_encoded_bytes()))
        .collect();
    Ok(Some(KeptFile {
        source: cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes()),
        fd,
        dirs,
        path: cstr(exe.as_os_str().as_encoded_bytes()),
    }))
}

/// A minimal /dev: a tmpfs with the `DEVICES`, a new devpts instance, a
/// /dev/shm and the `DEV_LINKS`.
struct PreparedDev {
    dev: CString,
    dev_data: CString,
    nodes: Vec<(CString, Dev)>,
    pts: CString,
    devpts: CString,
    pts_data: CString,
    shm: CString,
    shm_data: CString,
    links: Vec<(CString, CString)>,
}

fn prepare_confinement(c: &Confinement, masked_files: &[PathBuf]) -> io::Result<PreparedConfinement> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let (read_only, root_flags) = read_only_mounts(&mounts);
    let hide = [crate::names::run_dir(), PathBuf::from("/sys/fs/bpf")]
        .into_iter()
        .filter(|p| p.is_dir())
        .map(|p| cstr(p.as_os_str().as_encoded_bytes()))
        .collect();
    let dev = |name: &str| cstr(format!("/dev/{name}").as_bytes());
    Ok(PreparedConfinement {
        c: c.clone(),
        hide,
        masked: masked_files.iter().filter(|p| p.is_file()).map(|p| cstr(p.as_os_str().as_encoded_bytes())).collect(),
        dev_null: cstr(b"/dev/null"),
        read_only: read_only.into_iter().map(|(t, f)| (cstr(t.as_bytes()), f)).collect(),
        root_flags,
        private: PRIVATE_DIRS
            .iter()
            .filter(|(d, _)| std::path::Path::new(d).is_dir())
            .map(|(d, data)| (cstr(d.as_bytes()), cstr(data.as_bytes())))
            .collect(),
        keep_exe: keep_exe()?,
        tmpfs: cstr(b"tmpfs"),
        tmpfs_data: cstr(b"size=4k,mode=755"),
        dev: PreparedDev {
            dev: cstr(b"/dev"),
            dev_data: cstr(b"mode=755,size=64k"),
            nodes: DEVICES.iter().map(|(n, major, minor)| (dev(n), rustix::fs::makedev(*major, *minor))).collect(),
            pts: dev("pts"),
            devpts: cstr(b"devpts"),
            pts_data: cstr(b"newinstance,ptmxmode=0666,mode=0620,gid=5"),
            shm: dev("shm"),
            shm_data: cstr(b"mode=1777,size=65536k"),
            links: DEV_LINKS.iter().map(|(n, target)| (cstr(target.as_bytes()), dev(n))).collect(),
        },
    })
}

enum PreparedPidNs {
    New,
    Join(File),
}

struct Prepared {
    netns: File,
    cgroup_procs: File,
    mounts: Vec<(CString, CString)>,
    hostname: CString,
    root: CString,
    new_session: bool,
    private_mounts: bool,
    confinement: Option<PreparedConfinement>,
    pid_ns: Option<PreparedPidNs>,
    /// pod-init's status pipe, to keep open across exec.
    status_fd: Option<RawFd>,
}

/// Starts a process in the pod with the caller's privileges (root, every
/// capability, the host's files and PID namespace): the node proxy,
/// `exec --privileged`.
pub fn spawn(spec: &SandboxSpec) -> io::Result<Child> {
    let mut cmd = Command::new(resolve_program(&spec.argv[0]));
    cmd.args(&spec.argv[1..]);
    spawn_inner(spec, cmd, None)
}

/// Starts a pod's process confined as `c` says (needs `private_mounts`),
/// in the PID namespace `pid_ns`, under `slipstream pod-init` (see
/// `podinit`): the child returned is pod-init, which exits as the command
/// does. Returns an error, as for any spawn, when the command cannot start.
pub fn spawn_confined(spec: &SandboxSpec, c: &Confinement, pid_ns: PidNamespace) -> io::Result<Child> {
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let status_r = File::from(status_r);
    let init = InitSpec {
        confinement: c.clone(),
        new_pid_ns: pid_ns == PidNamespace::New,
        status_fd: status_w.as_raw_fd(),
        cgroup_signaller: spec.cgroup_signaller,
    };
    // /proc/self/exe: this very binary, even if it was replaced on disk.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("slipstream").arg("pod-init").arg("--spec").arg(serde_json::to_string(&init).map_err(io::Error::other)?).arg("--");
    cmd.arg(resolve_program(&spec.argv[0])).args(&spec.argv[1..]);
    let mut child = spawn_inner(spec, cmd, Some((c, pid_ns, status_w.as_raw_fd())))?;
    drop(status_w);
    match read_status(status_r, std::time::Duration::from_secs(10)) {
        Ok(msg) if msg.is_empty() => Ok(child),
        Ok(msg) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(io::Error::other(msg))
        }
        Err(e) => {
            tracing::warn!("pod-init of {} did not report: {e}", spec.argv[0]);
            Ok(child)
        }
    }
}

/// pod-init's report: empty once the command runs, else why it did not.
fn read_status(mut r: File, timeout: std::time::Duration) -> io::Result<String> {
    use std::io::Read;
    let deadline = std::time::Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Whole milliseconds, as poll(2) takes them.
        let left = rustix::event::Timespec { tv_sec: left.as_secs() as _, tv_nsec: (left.subsec_millis() * 1_000_000) as _ };
        let ready = rustix::event::poll(&mut [rustix::event::PollFd::new(&r, rustix::event::PollFlags::IN)], Some(&left));
        match ready {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no word within {timeout:?}"))),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
            Ok(_) => {
                let mut buf = [0u8; 4096];
                match r.read(&mut buf)? {
                    0 => return Ok(String::from_utf8_lossy(&out).into_owned()),
                    n => out.extend_from_slice(&buf[..n]),
                }
            }
        }
    }
}

fn spawn_inner(spec: &SandboxSpec, mut cmd: Command, confined: Option<(&Confinement, PidNamespace, RawFd)>) -> io::Result<Child> {
    let ctx = |what: &str, p: &std::path::Path| {
        let p = p.display().to_string();
        let what = what.to_string();
        move |e: io::Error| io::Error::new(e.kind(), format!("{what} {p}: {e}"))
    };
    let pid_ns = match confined {
        None => None,
        Some((_, PidNamespace::New, _)) => Some(PreparedPidNs::New),
        Some((_, PidNamespace::JoinContainer(pid), _)) => {
            let path = PathBuf::from(format!("/proc/{pid}/ns/pid_for_children"));
            let ns = File::open(&path).map_err(ctx("cannot open the container's PID namespace", &path))?;
            // Opened first, checked next: a reused pid cannot slip in between.
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if !in_cgroup(&cg, &spec.cgroup) {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("process {pid} is no longer the container's (it restarted?)")));
            }
            Some(PreparedPidNs::Join(ns))
        }
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
        confinement: match confined {
            Some(_) if !spec.private_mounts => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "a confined process needs a private mount namespace"))
            }
            Some((c, _, _)) => Some(prepare_confinement(c, &spec.masked_files)?),
            None => None,
        },
        pid_ns,
        status_fd: confined.map(|(_, _, fd)| fd),
    };
    cmd.env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    if let Some(log) = &spec.log {
        let f = OpenOptions::new().create(true).append(true).open(log).map_err(ctx("cannot open log", log))?;
        cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    }
    let mut prepared = prepared;
    // SAFETY: the closure calls only async-signal-safe functions (write,
    // setns, unshare, mount, mknod, chmod, mkdir, symlink, sethostname,
    // setsid, fcntl, open, dup3, close) on data prepared above.
    unsafe {
        cmd.pre_exec(move || enter(&mut prepared));
    }
    cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("cannot start {}: {e}", spec.argv[0])))
}

fn enter(p: &mut Prepared) -> io::Result<()> {
    // "0" moves the writing process itself into the cgroup.
    if rustix::io::write(&p.cgroup_procs, b"0")? != 1 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    rustix::thread::move_into_link_name_space(p.netns.as_fd(), Some(LinkNameSpaceType::Network))?;
    if p.private_mounts {
        // SAFETY: new mount and UTS namespaces; the fd table stays shared.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS | UnshareFlags::NEWUTS)? };
        // Keep our bind mounts from propagating back to the host.
        rustix::mount::mount_change(p.root.as_c_str(), MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)?;
        for (src, dst) in &p.mounts {
            mount_bind(src.as_c_str(), dst.as_c_str())?;
        }
        if let Some(c) = &mut p.confinement {
            confine_mounts(c, &p.root)?;
        }
        rustix::system::sethostname(p.hostname.as_bytes())?;
    }
    if p.new_session {
        rustix::process::setsid()?;
    }
    // For pod-init's children: its first becomes PID 1 of a new one.
    match &p.pid_ns {
        // SAFETY: a new PID namespace for the children; the fd table stays shared.
        Some(PreparedPidNs::New) => unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID)? },
        Some(PreparedPidNs::Join(ns)) => rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::ProcessID))?,
        None => {}
    }
    if let Some(fd) = p.status_fd {
        // Kept open across exec, for pod-init.
        // SAFETY: the status pipe's write end, which `spawn_confined` holds
        // open until the child is started.
        rustix::io::fcntl_setfd(unsafe { BorrowedFd::borrow_raw(fd) }, rustix::io::FdFlags::empty())?;
    }
    Ok(())
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// Makes every mount of this (private) mount namespace read-only, keeping
/// each one's other flags: mount_setattr(AT_RECURSIVE) on "/" (Linux 5.12),
/// else a read-only remount of each mount of the table. Async-signal-safe.
fn make_every_mount_read_only(p: &PreparedConfinement, root: &CStr) -> io::Result<()> {
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: a NUL-terminated path and a `struct mount_attr` of the size
    // passed, both alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            root.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    for (target, flags) in &p.read_only {
        // A mount point that is gone (deleted, or under another mount)
        // cannot be reached from the pod either.
        match mount_remount(target.as_c_str(), MountFlags::BIND | MountFlags::RDONLY | *flags, c"") {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// In the pod's mount namespace (after the hosts and resolv.conf binds):
/// every mount read-only; the cluster's state hidden and the masked files
/// covered; private /tmp, /var/tmp and /run; a minimal /dev.
/// Async-signal-safe.
fn confine_mounts(p: &mut PreparedConfinement, root: &CStr) -> io::Result<()> {
    let locked = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    let mode = Mode::from_raw_mode;
    if p.c.hide_host {
        if let Some(k) = &mut p.keep_exe {
            // Reopened here: a bind mount's source must be in this mount
            // namespace, and the fd opened before fork is in the caller's.
            // It takes the number `source` names.
            let fd = rustix::fs::open(k.path.as_c_str(), OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
            rustix::io::dup3(&fd, &mut k.fd, rustix::io::DupFlags::CLOEXEC)?;
        }
        make_every_mount_read_only(p, root)?;
        for dir in &p.hide {
            mount(p.tmpfs.as_c_str(), dir.as_c_str(), p.tmpfs.as_c_str(), MountFlags::RDONLY | locked, Some(p.tmpfs_data.as_c_str()))?;
        }
        for file in &p.masked {
            // Gone since it was checked: nothing to cover.
            match mount_bind(p.dev_null.as_c_str(), file.as_c_str()) {
                Ok(()) => {}
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
            // Not nodev: it reads as empty, as runc's masked paths do.
            let flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC;
            mount_remount(file.as_c_str(), flags, c"")?;
        }
        // After the hide (the run directory may be under /run or /tmp).
        for (dir, data) in &p.private {
            mount(p.tmpfs.as_c_str(), dir.as_c_str(), p.tmpfs.as_c_str(), MountFlags::NOSUID | MountFlags::NODEV, Some(data.as_c_str()))?;
        }
        if let Some(k) = &p.keep_exe {
            for d in &k.dirs {
                match rustix::fs::mkdir(d.as_c_str(), mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            drop(rustix::fs::open(k.path.as_c_str(), OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC, mode(0o555))?);
            mount_bind(k.source.as_c_str(), k.path.as_c_str())?;
            mount_remount(k.path.as_c_str(), MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV, c"")?;
        }
        if p.c.read_only_root {
            for (dir, _) in &p.private {
                mount_remount(dir.as_c_str(), MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV, c"")?;
            }
        }
        let d = &p.dev;
        mount(
            p.tmpfs.as_c_str(),
            d.dev.as_c_str(),
            p.tmpfs.as_c_str(),
            MountFlags::NOSUID | MountFlags::NOEXEC,
            Some(d.dev_data.as_c_str()),
        )?;
        for (path, dev) in &d.nodes {
            rustix::fs::mknodat(rustix::fs::CWD, path.as_c_str(), FileType::CharacterDevice, mode(0o666), *dev)?;
            // The umask took some bits away.
            rustix::fs::chmod(path.as_c_str(), mode(0o666))?;
        }
        rustix::fs::mkdir(d.pts.as_c_str(), mode(0o755))?;
        mount(
            d.devpts.as_c_str(),
            d.pts.as_c_str(),
            d.devpts.as_c_str(),
            MountFlags::NOSUID | MountFlags::NOEXEC,
            Some(d.pts_data.as_c_str()),
        )?;
        rustix::fs::mkdir(d.shm.as_c_str(), mode(0o755))?;
        mount(p.tmpfs.as_c_str(), d.shm.as_c_str(), p.tmpfs.as_c_str(), locked, Some(d.shm_data.as_c_str()))?;
        for (target, path) in &d.links {
            rustix::fs::symlink(target.as_c_str(), path.as_c_str())?;
        }
    }
    if p.c.read_only_root && !p.c.hide_host {
        mount_remount(root, MountFlags::BIND | MountFlags::RDONLY | p.root_flags, c"")?;
    }
    Ok(())
}

/// Bounding set, groups and ids, capability sets, ambient set,
/// no_new_privs, in the order the kernel allows them; `last_cap` from
/// /proc/sys/kernel/cap_last_cap. Async-signal-safe (pod-init calls it last
/// before the container's command runs).
pub(crate) fn drop_credentials(c: &Confinement, last_cap: u32) -> io::Result<()> {
    // Capability n as rustix names it, whether or not rustix knows it.
    let cap = |n: u32| CapabilitySet::from_bits_retain(1u64 << n);
    if let Some(set) = c.caps {
        for n in 0..=last_cap.min(63) {
            if set & (1u64 << n) == 0 {
                rustix::thread::remove_capability_from_bounding_set(cap(n))?;
            }
        }
    }
    if c.ambient != 0 {
        // Keep the permitted set across setuid, to raise the ambient set.
        rustix::thread::set_keep_capabilities(true)?;
    }
    let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    // SAFETY: setgroups reads `groups.len()` ids from the vector; setgid and
    // setuid take plain ids.
    unsafe {
        check(libc::setgroups(c.groups.len(), c.groups.as_ptr()))?;
        check(libc::setgid(c.gid))?;
        check(libc::setuid(c.uid))?;
    }
    if let Some(set) = c.caps {
        // uid 0: what it holds; others: only what they add (inheritable too,
        // which the ambient set requires).
        let (held, inheritable) = if c.uid == 0 { (set, 0) } else { (c.ambient, c.ambient) };
        let (held, inheritable) = (CapabilitySet::from_bits_retain(held), CapabilitySet::from_bits_retain(inheritable));
        rustix::thread::set_capabilities(None, CapabilitySets { effective: held, permitted: held, inheritable })?;
        for n in 0..=last_cap.min(63) {
            if c.ambient & (1u64 << n) != 0 {
                rustix::thread::configure_capability_in_ambient_set(cap(n), true)?;
            }
        }
    }
    if c.no_new_privs {
        rustix::thread::set_no_new_privs(true)?;
    }
    Ok(())
}

/// Makes this process non-dumpable (the agent, which holds the mesh's
/// keys): the mesh processes' own set-up, `slipstream_proxy::process`.
pub fn make_non_dumpable() -> io::Result<()> {
    slipstream_proxy::process::make_non_dumpable()
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
        cmd.pre_exec(|| Ok(rustix::process::setsid().map(drop)?));
    }
    cmd.spawn()
}

/// What pod-init is told, as one JSON argument written by `spawn_confined`
/// (from a `Confinement` it already validated).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InitSpec {
    pub confinement: Confinement,
    /// A new PID namespace, whose PID 1 pod-init starts; false when it joins
    /// a running container's (`exec`, exec probes).
    pub new_pid_ns: bool,
    /// Written with the reason when the command cannot be started, then
    /// closed; closed empty once it runs.
    pub status_fd: RawFd,
    /// Besides pod-init's parent, the process that signals every process of
    /// the pod's cgroup (the agent, when `exec` started pod-init).
    #[serde(default)]
    pub cgroup_signaller: Option<libc::pid_t>,
}
