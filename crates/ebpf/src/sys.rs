//! The few bpf(2) commands aya 0.13 does not offer for our programs: a
//! link created for a cgroup hook cannot be turned into a pinnable link
//! there, and links are what let the datapath outlive the process that
//! attached it (pinned under the cluster's bpffs directory) and be
//! replaced in place (BPF_LINK_UPDATE) by a newer binary.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

pub const ATTACH_CGROUP_SOCK_OPS: u32 = 3;
pub const ATTACH_CGROUP_INET4_CONNECT: u32 = 10;
pub const ATTACH_CGROUP_INET6_CONNECT: u32 = 11;
pub const ATTACH_CGROUP_UDP4_SENDMSG: u32 = 14;
pub const ATTACH_CGROUP_UDP6_SENDMSG: u32 = 15;
pub const ATTACH_CGROUP_INET4_GETPEERNAME: u32 = 29;
pub const ATTACH_CGROUP_INET_SOCK_RELEASE: u32 = 34;
/// tcx (Linux 6.6): a link on a device's ingress, no qdisc needed.
pub const ATTACH_TCX_INGRESS: u32 = 46;
pub const ATTACH_TCX_EGRESS: u32 = 47;

/// `union bpf_attr`, as large as any command here needs; unused bytes zero.
#[repr(C, align(8))]
struct Attr([u32; 32]);

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: attr is a valid, writable, 8-aligned buffer of the size
    // passed; the kernel reads (and for some commands writes) only within it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, std::mem::size_of::<Attr>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us; nobody else
    // owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// BPF_LINK_CREATE: attaches `prog` to `target` (a cgroup or a network
/// namespace) and returns the link.
pub fn link_create(prog: BorrowedFd<'_>, target: BorrowedFd<'_>, attach_type: u32) -> io::Result<OwnedFd> {
    let mut a = Attr([0; 32]);
    a.0[0] = prog.as_raw_fd() as u32;
    a.0[1] = target.as_raw_fd() as u32;
    a.0[2] = attach_type;
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

/// BPF_LINK_CREATE on a network device (tcx), by its index in the
/// calling thread's network namespace.
pub fn link_create_ifindex(prog: BorrowedFd<'_>, ifindex: u32, attach_type: u32) -> io::Result<OwnedFd> {
    let mut a = Attr([0; 32]);
    a.0[0] = prog.as_raw_fd() as u32;
    a.0[1] = ifindex;
    a.0[2] = attach_type;
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

/// Runs `f` on a thread that has entered the network namespace at
/// `netns` (device indexes and names are per namespace).
pub fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = std::fs::File::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only (a fresh one that ends with
            // the scope); the descriptor is a valid open namespace file.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| io::Error::other("namespace thread panicked"))?
    })
}

/// The cookie of the network namespace at `netns` (a socket is made
/// there to ask, and closed).
pub fn netns_cookie_of(netns: &Path) -> io::Result<u64> {
    in_netns(netns, || {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is ours alone.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        netns_cookie(std::os::fd::AsFd::as_fd(&sock))
    })
}

/// The mount point of the cgroup2 hierarchy (the unified one in a hybrid
/// layout), from /proc/mounts.
pub fn cgroup2_root() -> io::Result<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| std::path::PathBuf::from(f[1]))
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup2 hierarchy is mounted (see /proc/mounts)"))
}

/// The index of a device in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

/// The hardware (MAC) address of a network device of the calling
/// thread's network namespace (SIOCGIFHWADDR).
pub fn hwaddr(name: &str) -> io::Result<[u8; 6]> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "device name too long"));
    }
    // SAFETY: a plain datagram socket, closed by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a socket we just opened and own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: req is a valid ifreq with a NUL-terminated name; the kernel
    // writes the address into its union.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled ifru_hwaddr.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

/// BPF_LINK_UPDATE: swaps the program of a link, atomically; the hook
/// never runs without one.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = Attr([0; 32]);
    a.0[0] = link.as_raw_fd() as u32;
    a.0[1] = prog.as_raw_fd() as u32;
    bpf(BPF_LINK_UPDATE, &mut a).map(|_| ())
}

fn path_c(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// BPF_OBJ_PIN: makes `fd` (a link, map or program) outlive us at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let p = path_c(path)?;
    let mut a = Attr([0; 32]);
    let ptr = p.as_ptr() as u64;
    a.0[0] = ptr as u32;
    a.0[1] = (ptr >> 32) as u32;
    a.0[2] = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &mut a).map(|_| ())
}

/// BPF_OBJ_GET: opens a pinned object.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let p = path_c(path)?;
    let mut a = Attr([0; 32]);
    let ptr = p.as_ptr() as u64;
    a.0[0] = ptr as u32;
    a.0[1] = (ptr >> 32) as u32;
    bpf(BPF_OBJ_GET, &mut a).map(owned)
}

/// The cgroup a cgroup link is attached to (its id, the inode number of
/// its cgroup2 directory), from BPF_OBJ_GET_INFO_BY_FD; 0 when the cgroup
/// is gone (the link is defunct).
pub fn link_cgroup_id(link: BorrowedFd<'_>) -> io::Result<u64> {
    // struct bpf_link_info: type, id, prog_id (u32 each), then the union,
    // 8-aligned: for a cgroup link, cgroup_id (u64) and attach_type.
    #[repr(C, align(8))]
    struct Info([u64; 8]);
    let mut info = Info([0; 8]);
    let mut a = Attr([0; 32]);
    a.0[0] = link.as_raw_fd() as u32;
    a.0[1] = std::mem::size_of::<Info>() as u32;
    let ptr = &mut info as *mut Info as u64;
    a.0[2] = ptr as u32;
    a.0[3] = (ptr >> 32) as u32;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(info.0[2])
}

/// BPF_MAP_LOOKUP_AND_DELETE_ELEM on a hash map (Linux 5.14): one
/// system call where lookup then delete takes two. `None` when the key is
/// not there.
pub fn map_take<K: aya::Pod, V: aya::Pod + Default>(map: BorrowedFd<'_>, key: &K) -> io::Result<Option<V>> {
    let mut value = V::default();
    let mut a = Attr([0; 32]);
    let (k, v) = (key as *const K as u64, &mut value as *mut V as u64);
    a.0[0] = map.as_raw_fd() as u32;
    a.0[2] = k as u32;
    a.0[3] = (k >> 32) as u32;
    a.0[4] = v as u32;
    a.0[5] = (v >> 32) as u32;
    match bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut a) {
        Ok(_) => Ok(Some(value)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// BPF_PROG_TEST_RUN: runs `prog` once on `packet` (a whole frame) in
/// the calling thread's network namespace; returns the program's verdict.
pub fn prog_test_run(prog: BorrowedFd<'_>, packet: &[u8]) -> io::Result<u32> {
    prog_test_run_mark(prog, packet, 0)
}

/// BPF_PROG_TEST_RUN with `skb->mark` set (the test programs read inputs
/// that are not in the packet from it).
pub fn prog_test_run_mark(prog: BorrowedFd<'_>, packet: &[u8], mark: u32) -> io::Result<u32> {
    prog_test_run_full(prog, packet, mark).map(|(r, _)| r)
}

/// BPF_PROG_TEST_RUN returning the verdict and the packet as the program
/// left it (rewritten, trimmed).
pub fn prog_test_run_full(prog: BorrowedFd<'_>, packet: &[u8], mark: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; packet.len() + 256];
    // struct __sk_buff up to and including mark: len, pkt_type, mark.
    let ctx: [u32; 3] = [0, 0, mark];
    let mut a = Attr([0; 32]);
    let c = ctx.as_ptr() as u64;
    a.0[10] = std::mem::size_of_val(&ctx) as u32;
    a.0[12] = c as u32;
    a.0[13] = (c >> 32) as u32;
    let (pin, pout) = (packet.as_ptr() as u64, out.as_mut_ptr() as u64);
    a.0[0] = prog.as_raw_fd() as u32;
    a.0[2] = packet.len() as u32;
    a.0[3] = out.len() as u32;
    a.0[4] = pin as u32;
    a.0[5] = (pin >> 32) as u32;
    a.0[6] = pout as u32;
    a.0[7] = (pout >> 32) as u32;
    a.0[8] = 1;
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    out.truncate(a.0[3] as usize);
    Ok((a.0[1], out))
}

/// The cookie of the network namespace a socket lives in
/// (SO_NETNS_COOKIE), the key sockops.c files original destinations under.
pub fn netns_cookie(sock: BorrowedFd<'_>) -> io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r =
        unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, SO_NETNS_COOKIE, &mut v as *mut u64 as *mut libc::c_void, &mut len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}
