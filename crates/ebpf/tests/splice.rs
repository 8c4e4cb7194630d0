//! What sockmap/sk_msg splicing of a local leg gives on this kernel, and
//! why the datapath does not splice the app-to-proxy legs yet
//! (docs/datapath.md, "Kernel-spliced local legs"). Real sockets in a
//! network namespace made for the test, the test program
//! (bpf/test_splice.c) in the real kernel. Needs root and a cgroup2 mount,
//! as the datapath itself: these fail loudly without them.
//!
//! The measurement: `cargo test --release -p slipstream-ebpf --test splice
//! -- --ignored --nocapture`.
#![allow(unsafe_code)]

use aya::maps::{Array, SockHash};
use aya::programs::{SkMsg, SockOps};
use slipstream_ebpf::sys;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/test_splice.o"));

#[repr(C)]
#[derive(Clone, Copy)]
struct Leg {
    local_ip: u32,
    remote_ip: u32,
    local_port: u32,
    remote_port: u32,
}
// SAFETY: repr(C), integers only, no padding.
unsafe impl aya::Pod for Leg {}

/// A network namespace of the test's own, with loopback up.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let uid = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(
            uid.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")),
            "these tests make network namespaces and attach BPF programs: run them as root (make test does)"
        );
        let name = format!("ss-splice-{tag}-{}", std::process::id());
        for args in [vec!["netns", "add", &name], vec!["-n", &name, "link", "set", "lo", "up"]] {
            let o = std::process::Command::new("ip").args(&args).output().expect("ip");
            assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        }
        Netns(name)
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.0)
    }

    fn run<T: Send>(&self, f: impl FnOnce() -> std::io::Result<T> + Send) -> T {
        sys::in_netns(&self.path(), f).expect("in the test namespace")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "delete", &self.0]).status();
    }
}

/// The splicing programs, acting in `ns` only; detached when dropped.
struct Splicer {
    _obj: aya::Ebpf,
    _legs: SockHash<aya::maps::MapData, Leg>,
    counts: Array<aya::maps::MapData, u64>,
    _link: OwnedFd,
}

impl Splicer {
    fn attach(ns: &Netns) -> Splicer {
        let cookie = sys::netns_cookie_of(&ns.path()).unwrap();
        let mut obj = aya::EbpfLoader::new().set_global("ss_test_netns", &cookie, true).load(OBJ).unwrap();
        let legs: SockHash<_, Leg> = SockHash::try_from(obj.take_map("ss_test_legs").unwrap()).unwrap();
        let counts: Array<_, u64> = Array::try_from(obj.take_map("ss_test_counts").unwrap()).unwrap();
        let msg: &mut SkMsg = obj.program_mut("ss_test_splice_msg").unwrap().try_into().unwrap();
        msg.load().unwrap();
        msg.attach(legs.fd()).unwrap();
        let ops: &mut SockOps = obj.program_mut("ss_test_splice_sockops").unwrap().try_into().unwrap();
        ops.load().unwrap();
        let root = std::fs::File::open(sys::cgroup2_root().unwrap()).unwrap();
        let link = sys::link_create(ops.fd().unwrap().as_fd(), root.as_fd(), sys::ATTACH_CGROUP_SOCK_OPS).unwrap();
        Splicer { _obj: obj, _legs: legs, counts, _link: link }
    }

    /// (messages spliced, messages left to TCP)
    fn counts(&self) -> (u64, u64) {
        (self.counts.get(&0, 0).unwrap(), self.counts.get(&1, 0).unwrap())
    }
}

/// A connected loopback pair: (client, accepted server side).
fn pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    Ok((c, s))
}

/// Writes `total` bytes of a counting pattern from one end while the other
/// reads and, if `check`, checks every byte; returns the time it took.
fn transfer(total: usize, chunk: usize, check: bool) -> std::io::Result<Duration> {
    let (mut c, mut s) = pair()?;
    let t = Instant::now();
    std::thread::scope(|scope| {
        let w = scope.spawn(move || -> std::io::Result<()> {
            let mut buf = vec![0u8; chunk];
            let mut n: usize = 0;
            while n < total {
                let len = chunk.min(total - n);
                if check {
                    for (i, b) in buf[..len].iter_mut().enumerate() {
                        *b = ((n + i) % 251) as u8;
                    }
                }
                c.write_all(&buf[..len])?;
                n += len;
            }
            Ok(())
        });
        let mut buf = vec![0u8; 1 << 17];
        let mut n: usize = 0;
        while n < total {
            let got = s.read(&mut buf)?;
            assert!(got > 0, "end of stream after {n} of {total} bytes");
            if check {
                for (i, b) in buf[..got].iter().enumerate() {
                    assert_eq!(*b, ((n + i) % 251) as u8, "byte {} out of order or changed", n + i);
                }
            }
            n += got;
        }
        w.join().expect("writer")
    })?;
    Ok(t.elapsed())
}

#[test]
fn spliced_bytes_arrive_whole_and_in_order() {
    let ns = Netns::new("order");
    let sp = Splicer::attach(&ns);
    ns.run(|| transfer(64 << 20, 100_000, true));
    let (spliced, tcp) = sp.counts();
    assert!(spliced > 600, "the transfer went through the sockhash ({spliced} messages spliced, {tcp} on TCP)");
    assert_eq!(tcp, 0, "no message of an established pair fell back to TCP");
}

/// Why the datapath does not splice yet: spliced bytes are queued on the
/// reader with no bound (the kernel charges them to it but never checks
/// its receive buffer), so a reader that does not read lets the writer
/// queue without end, where TCP's flow control stops it after a few
/// megabytes. A pod that could do this to its node proxy's sockets could
/// hold the node's TCP memory. When this test fails, the kernel has
/// grown backpressure for sk_msg redirection: revisit the design.
#[test]
fn a_reader_that_does_not_read_gives_a_spliced_writer_no_backpressure() {
    let fill = || -> std::io::Result<usize> {
        let (mut c, _s) = pair()?;
        c.set_nonblocking(true)?;
        let buf = vec![7u8; 1 << 16];
        let mut sent = 0;
        while sent < 256 << 20 {
            match c.write(&buf) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    };
    let plain = Netns::new("plain");
    let tcp = plain.run(fill);
    let ns = Netns::new("bp");
    let _sp = Splicer::attach(&ns);
    let spliced = ns.run(fill);
    assert!(tcp < 32 << 20, "TCP stops a writer whose reader does not read: {} MB", tcp >> 20);
    assert!(spliced >= 256 << 20, "spliced, it queued {} MB before the test stopped it", spliced >> 20);
}

#[test]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
fn measure_a_spliced_leg_against_tcp() {
    let cpu = || -> f64 {
        // SAFETY: rusage is plain integers; all zero is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: ru is a valid rusage to write.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    };
    let total = 8usize << 30;
    for chunk in [16 << 10, 128 << 10] {
        let plain = Netns::new("mplain");
        let c0 = cpu();
        let tp = plain.run(|| transfer(total, chunk, false));
        let cpu_plain = cpu() - c0;
        let ns = Netns::new("msplice");
        let _sp = Splicer::attach(&ns);
        let c1 = cpu();
        let ts = ns.run(|| transfer(total, chunk, false));
        let cpu_spliced = cpu() - c1;
        let gbps = |d: Duration| (total * 8) as f64 / d.as_secs_f64() / 1e9;
        println!(
            "{} KiB writes: TCP {:.1} Gb/s, {:.2} CPU-s/GiB; spliced {:.1} Gb/s ({:.2}x), {:.2} CPU-s/GiB ({:.2}x)",
            chunk >> 10,
            gbps(tp),
            cpu_plain / 8.0,
            gbps(ts),
            gbps(ts) / gbps(tp),
            cpu_spliced / 8.0,
            cpu_spliced / cpu_plain
        );
    }
}
