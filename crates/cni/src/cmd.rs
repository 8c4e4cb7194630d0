//! Running the system tools capture is made with (`nft`, `ip`) inside a
//! pod's network namespace, with errors that show the command and what it
//! printed.
//!
//! A tool runs in a namespace given by its path (`/run/netns/<name>`, or a
//! CNI's `CNI_NETNS`): a short-lived thread enters the namespace with
//! setns(2) and spawns the tool from there, so the child starts inside it
//! (a child inherits the namespaces of the thread that forks it). No
//! `ip netns exec` (it needs a name under /run/netns and remounts /sys) and
//! no `nsenter` (one program fewer in the image).

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
#[error("`{cmd}` failed: {detail}")]
pub struct CmdError {
    pub cmd: String,
    pub detail: String,
}

/// Runs `argv` in this process's network namespace, feeding `stdin` if
/// given; Ok(stdout) on exit status 0.
pub fn run(argv: &[&str], stdin: Option<&str>) -> Result<String, CmdError> {
    let shown = argv.join(" ");
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = c.spawn().map_err(|e| CmdError {
        cmd: shown.clone(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            format!("{} is not installed (scripts/setup.sh installs it; the image carries it)", argv[0])
        } else {
            e.to_string()
        },
    })?;
    if let (Some(input), Some(mut si)) = (stdin, child.stdin.take()) {
        let _ = si.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| CmdError { cmd: shown.clone(), detail: e.to_string() })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let first: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).take(6).collect();
    Err(CmdError {
        cmd: match stdin {
            Some(input) => format!("{shown} <<{}", input.lines().next().unwrap_or("")),
            None => shown,
        },
        detail: format!("{} ({})", first.join("; "), out.status),
    })
}

/// Runs `argv` inside the network namespace at `netns`.
pub fn run_in(netns: &Path, argv: &[&str], stdin: Option<&str>) -> Result<String, CmdError> {
    let shown = || format!("{} (in {})", argv.join(" "), netns.display());
    let ns =
        std::fs::File::open(netns).map_err(|e| CmdError { cmd: shown(), detail: format!("cannot open the network namespace: {e}") })?;
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    let worker = std::thread::Builder::new().name("in-netns".into()).spawn(move || {
        // This thread only: it ends right after, so it never returns.
        move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
            .map_err(|e| CmdError { cmd: argv.join(" "), detail: format!("cannot enter the network namespace: {e}") })?;
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        run(&argv, stdin.as_deref())
    });
    let worker = worker.map_err(|e| CmdError { cmd: shown(), detail: format!("cannot start a thread: {e}") })?;
    worker.join().map_err(|_| CmdError { cmd: shown(), detail: "the thread running it panicked".into() })?.map_err(|mut e| {
        e.cmd = format!("{} (in {})", e.cmd, netns.display());
        e
    })
}

/// Runs `f` on a short-lived thread inside the network namespace at
/// `netns` (what this process's own files under /proc/sys/net then show
/// is that namespace's), for work that needs no tool.
pub fn in_netns<T: Send>(netns: &Path, what: &str, f: impl FnOnce() -> std::io::Result<T> + Send) -> Result<T, CmdError> {
    let err = |detail: String| CmdError { cmd: format!("{what} (in {})", netns.display()), detail };
    let ns = std::fs::File::open(netns).map_err(|e| err(format!("cannot open the network namespace: {e}")))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // This thread only: it ends with the scope.
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
                .map_err(|e| err(format!("cannot enter the network namespace: {e}")))?;
            f().map_err(|e| err(e.to_string()))
        })
        .join()
        .map_err(|_| err("the thread running it panicked".into()))?
    })
}

/// Runs several `ip` commands inside one network namespace with one process.
pub fn ip_batch(netns: &Path, lines: &[String]) -> Result<(), CmdError> {
    run_in(netns, &["ip", "-batch", "-"], Some(&(lines.join("\n") + "\n"))).map(|_| ())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_tool_and_a_failing_one_say_what_ran() {
        let e = super::run(&["slipstream-no-such-tool", "x"], None).unwrap_err();
        assert!(e.to_string().contains("slipstream-no-such-tool is not installed"), "{e}");
        let e = super::run(&["sh", "-c", "echo oops >&2; exit 3"], None).unwrap_err();
        assert!(e.to_string().contains("oops") && e.to_string().contains("exit status: 3"), "{e}");
        let e = super::run_in(std::path::Path::new("/nonexistent/netns"), &["true"], None).unwrap_err();
        assert!(e.to_string().contains("cannot open the network namespace"), "{e}");
    }

    #[test]
    fn a_closure_runs_inside_the_namespace_and_its_error_names_it() {
        // A namespace of its own (root: a process in a new one), so that
        // running in ours by mistake shows.
        let mut holder = std::process::Command::new("unshare").args(["--net", "sleep", "30"]).spawn().expect("unshare (util-linux)");
        let theirs_path = std::path::PathBuf::from(format!("/proc/{}/ns/net", holder.id()));
        let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let mut theirs = std::fs::read_link(&theirs_path).unwrap();
        for _ in 0..100 {
            if theirs != ours {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            theirs = std::fs::read_link(&theirs_path).unwrap();
        }
        let seen = super::in_netns(&theirs_path, "look", || std::fs::read_link("/proc/thread-self/ns/net")).unwrap();
        let _ = holder.kill();
        let _ = holder.wait();
        assert_ne!(theirs, ours, "unshare made no namespace");
        assert_eq!(seen, theirs, "ran inside the namespace");
        assert_eq!(std::fs::read_link("/proc/thread-self/ns/net").unwrap(), ours, "this thread stayed in its own");
        let e = super::in_netns(std::path::Path::new("/proc/self/ns/net"), "write x", || -> std::io::Result<()> {
            Err(std::io::Error::other("refused"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("write x (in /proc/self/ns/net)") && e.to_string().contains("refused"), "{e}");
    }

    #[test]
    fn runs_in_its_own_namespace_when_given_ours() {
        let out = super::run_in(std::path::Path::new("/proc/self/ns/net"), &["sh", "-c", "echo hi"], None).unwrap();
        assert_eq!(out, "hi\n");
    }
}
