//! Facts about the machine and the source tree a run happened on. Parsing is
//! pure; `read` and `commit` do the I/O.

use crate::results::{Commit, Machine};
use std::process::Command;

pub fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

pub fn cpu_count(cpuinfo: &str) -> usize {
    cpuinfo.lines().filter(|l| l.split(':').next().map(str::trim) == Some("processor")).count()
}

pub fn mem_total_gib(meminfo: &str) -> f64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / (1024.0 * 1024.0))
        .unwrap_or(0.0)
}

pub fn os_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into())
}

pub fn read() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or_else(|_| cpu_count(&cpuinfo));
    Machine {
        cpu_model: cpu_model(&cpuinfo),
        cores,
        memory_gib: mem_total_gib(&read("/proc/meminfo")),
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        os: os_name(&read("/etc/os-release")),
        open_files_limit: 0,
    }
}

/// The commit checked out in the current directory, if it is a git tree.
pub fn commit() -> Option<Commit> {
    let out = Command::new("git").args(["rev-parse", "HEAD"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false);
    Some(Commit { hash, dirty })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu vme\n\n\
processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n";

    #[test]
    fn parses_proc_files() {
        assert_eq!(cpu_model(CPUINFO), "Intel(R) Xeon(R) CPU @ 2.20GHz");
        assert_eq!(cpu_count(CPUINFO), 2);
        assert_eq!(cpu_model(""), "unknown");
        let gib = mem_total_gib("MemTotal:       24590412 kB\nMemFree:        23000000 kB\n");
        assert!((gib - 23.4513).abs() < 1e-3, "{gib}");
        assert_eq!(
            os_name("NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
    }
}
