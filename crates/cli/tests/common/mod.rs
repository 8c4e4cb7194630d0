//! Test tier 3: the real binary, real network namespaces, real processes.
//! Each test uses its own cluster name, so tests run in parallel without
//! seeing each other, and checks that `down` leaves nothing of it behind.
#![allow(dead_code)]

use serde_json::Value;
use slipstream_core::sync::LockExt;
use std::fmt::Display;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_slipstream")
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// These tests create network namespaces and cgroups: without root they
/// cannot run, and they fail loudly rather than pass silently.
pub fn require_root() {
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(String::from))
        .unwrap();
    assert_eq!(uid, "0", "integration tests need root (network namespaces, cgroups): run `make test` as root");
}

pub struct Cluster {
    pub name: String,
    down_on_drop: bool,
}

pub fn run(cluster: &str, args: &[&str]) -> Output {
    Command::new(bin()).arg("--cluster").arg(cluster).args(args).output().expect("run slipstream")
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

impl Cluster {
    /// `slipstream up` with `args`; panics with its output if it fails.
    pub fn up(name: &str, args: &[&str]) -> Cluster {
        require_root();
        // A previous crashed run of this same test may have left a cluster.
        let _ = run(name, &["down"]);
        let mut a = vec!["up"];
        a.extend_from_slice(args);
        let o = run(name, &a);
        let c = Cluster { name: name.to_string(), down_on_drop: true };
        assert!(o.status.success(), "up failed:\n{}", text(&o));
        c
    }

    /// [`Cluster::up`] with environment variables for `slipstream up` (the
    /// agent passes `SLIPSTREAM_NODE_*` on to the node proxies).
    pub fn up_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Cluster {
        require_root();
        let _ = run(name, &["down"]);
        let o =
            Command::new(bin()).arg("--cluster").arg(name).arg("up").args(args).envs(env.iter().copied()).output().expect("run slipstream");
        let c = Cluster { name: name.to_string(), down_on_drop: true };
        assert!(o.status.success(), "up failed:\n{}", text(&o));
        c
    }

    pub fn adopt(name: &str) -> Cluster {
        Cluster { name: name.to_string(), down_on_drop: true }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        run(&self.name, args)
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "slipstream {args:?} failed:\n{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn status(&self) -> Value {
        serde_json::from_str(&self.ok(&["status", "-o", "json"])).expect("status json")
    }

    /// Runs a command in a pod; returns (exit code, stdout).
    pub fn exec(&self, ns: &str, pod: &str, cmd: &[&str]) -> (i32, String) {
        let mut a = vec!["exec", "-n", ns, pod, "--"];
        a.extend_from_slice(cmd);
        let o = self.run(&a);
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
    }

    pub fn pods(&self, prefix: &str) -> Vec<Value> {
        self.status()["pods"].as_array().unwrap().iter().filter(|p| p["name"].as_str().unwrap().starts_with(prefix)).cloned().collect()
    }

    /// `down`, then proof that nothing of this cluster is left.
    pub fn down(mut self) {
        self.down_on_drop = false;
        let o = self.run(&["down"]);
        assert!(o.status.success(), "down failed:\n{}", text(&o));
        assert_clean(&self.name);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.down_on_drop {
            let _ = run(&self.name, &["down"]);
        }
    }
}

/// Nothing of the cluster remains: no network namespace, cgroup, process,
/// state or pinned object.
pub fn assert_clean(name: &str) {
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| rd.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.starts_with(&format!("{name}."))).collect())
        .unwrap_or_default();
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
    let cg = cgroup2().join("slipstream").join(name);
    assert!(!cg.exists(), "cgroup left: {}", cg.display());
    assert!(!Path::new("/run/slipstream").join(name).exists(), "state directory left");
    assert!(!Path::new("/sys/fs/bpf/slipstream").join(name).exists(), "pinned BPF objects left");
    let procs = processes_mentioning(&format!("--cluster {name} "));
    assert!(procs.is_empty(), "processes left: {procs:?}");
}

pub fn cgroup2() -> PathBuf {
    let m = std::fs::read_to_string("/proc/mounts").unwrap();
    m.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .expect("cgroup2 mounted")
}

/// Command lines (space-joined) of live processes containing `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let line = c.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>().join(" ") + " ";
            if line.contains(needle) {
                out.push(line);
            }
        }
    }
    out
}

/// Waits until `done` holds, checking every 100 ms. If it still does not
/// after `within`, panics saying what never happened: "timed out after 10s
/// waiting for {what}". `what` is only formatted then, so a [`Later`] can
/// show the state at that moment. Tests use this, not a sleep, whenever
/// they need something to have happened.
pub fn wait_until(what: impl Display, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A [`wait_until`] message written when the wait fails, e.g. with the log
/// or the status at that moment.
pub struct Later<F>(pub F);

impl<F: Fn() -> String> Display for Later<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.0)())
    }
}

/// What a child process writes to a pipe, read by a thread as it comes, so
/// that a test can wait for a line while the child still runs.
pub struct Collected {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Collected {
    pub fn new(mut pipe: impl Read + Send + 'static) -> Collected {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = bytes.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                sink.locked().extend_from_slice(&buf[..n]);
            }
        });
        Collected { bytes, reader }
    }

    /// What arrived so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.locked()).into_owned()
    }

    /// Everything, once the pipe is closed (the child has exited).
    pub fn finish(self) -> String {
        let Collected { bytes, reader } = self;
        reader.join().unwrap();
        let bytes = bytes.locked();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

pub fn write_manifest(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// One node proxy as the tests observe it.
pub struct Proxy {
    pub node: String,
    pub pid: i32,
    pub netns: String,
    pub log: String,
}

impl Proxy {
    pub fn of(c: &Cluster, node: &str) -> Proxy {
        let st = c.status();
        let n = st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == node).unwrap_or_else(|| panic!("no node {node}: {st}"));
        Proxy {
            node: node.to_string(),
            pid: n["proxy"]["pid"].as_i64().expect("node proxy pid") as i32,
            netns: n["netns"].as_str().unwrap().to_string(),
            log: n["proxy"]["log"].as_str().unwrap().to_string(),
        }
    }

    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| d.count())
            .unwrap_or_else(|e| panic!("node proxy of {} (pid {}) is gone: {e}", self.node, self.pid))
    }

    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap()
    }

    /// A fresh scrape of /metrics from the node's own namespace.
    pub fn metrics(&self) -> Metrics {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.netns, "curl", "-sS", "--max-time", "5", "http://127.0.0.1:15020/metrics"])
            .output()
            .unwrap();
        assert!(o.status.success(), "metrics of {}: {}", self.node, text(&o));
        Metrics(String::from_utf8(o.stdout).unwrap())
    }

    pub fn log_len(&self) -> usize {
        std::fs::metadata(&self.log).map(|m| m.len() as usize).unwrap_or(0)
    }

    pub fn log_since(&self, offset: usize) -> String {
        let all = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&all[offset.min(all.len())..]).into_owned()
    }

    /// Still the process it was, never restarted.
    pub fn assert_same(&self, c: &Cluster, case: &str) {
        let st = c.status();
        let n = st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == self.node.as_str()).unwrap();
        assert_eq!(n["proxy"]["pid"].as_i64(), Some(self.pid as i64), "{case}: the node proxy of {} was replaced", self.node);
        assert_eq!(n["proxy"]["restarts"], 0, "{case}: the node proxy of {} restarted", self.node);
    }

    /// Waits until the proxy holds at most `max` descriptors.
    pub fn settle_fds(&self, case: &str, max: usize) {
        let what = Later(|| format!("{case}: the node proxy of {} to hold at most {max} descriptors; it holds {}", self.node, self.fds()));
        wait_until(what, Duration::from_secs(15), || self.fds() <= max);
    }
}

pub struct Metrics(pub String);

impl Metrics {
    /// Sum over the series of `name` whose labels contain every `must`.
    pub fn sum(&self, name: &str, must: &[&str]) -> u64 {
        self.0
            .lines()
            .filter(|l| (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))) && must.iter().all(|m| l.contains(m)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}
