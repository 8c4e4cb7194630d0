//! Dropping the server leaves nothing behind: no process, no directory, no
//! descriptor. A file of its own, so that no other test opens descriptors
//! in this process while they are counted.

use std::path::Path;
use std::time::{Duration, Instant};

use slipstream_kubetest::KubeTestServer;

fn open_fds() -> Vec<String> {
    let fds = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).map(|p| p.display().to_string()).collect()
}

/// Pids are handed out in increasing order (wrapping at pid_max), so one
/// reaped a moment ago is not someone else's yet.
fn running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn drop_kills_both_processes_and_removes_the_directory() -> anyhow::Result<()> {
    // Counted inside the runtime: its descriptors (and Tokio's process-wide
    // signal socket pair) are not the server's.
    let fds_before = open_fds().len();
    let server = KubeTestServer::start().await?;
    let pids = server.pids();
    let dir = server.dir().to_path_buf();
    assert!(running(pids.etcd) && running(pids.apiserver), "{pids:?} run while the server lives");
    assert!(dir.join("kube-apiserver.log").exists());
    // A request, so that a client's connection is open when the server goes.
    let client = server.client().await?;
    let version = client.apiserver_version().await?;
    // The minor our k8s-openapi types are for; stamped in by scripts/kube-apiserver.sh.
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "32"), "{version:?}");
    drop(client);
    drop(server);

    // Drop waits for both, so they are gone at once, not eventually.
    assert!(!running(pids.etcd), "etcd (pid {}) outlived the server", pids.etcd);
    assert!(!running(pids.apiserver), "kube-apiserver (pid {}) outlived the server", pids.apiserver);
    assert!(!dir.exists(), "{} outlived the server", dir.display());
    // The client's connection closes when its task next runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_fds().len() > fds_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = open_fds();
    assert_eq!(after.len(), fds_before, "descriptors leaked: {after:?}");
    Ok(())
}
