//! One node proxy process per node, supervised like a DaemonSet's pod:
//! restarted with back-off when it exits, in the node's network namespace
//! and its own cgroup.

use super::pods::Node;
use crate::names::{netns_path, Paths};
use crate::sys::spawn;
use std::process::Child;
use std::time::{Duration, Instant};

pub struct NodeProxy {
    pub node: String,
    child: Option<Child>,
    pub restarts: u32,
    next_start: Instant,
    backoff: Duration,
    started: bool,
}

impl NodeProxy {
    pub fn new(node: &Node) -> Self {
        NodeProxy {
            node: node.name.clone(),
            child: None,
            restarts: 0,
            next_start: Instant::now(),
            backoff: Duration::from_millis(500),
            started: false,
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn tick(&mut self, paths: &Paths, node: &Node) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                tracing::warn!(node = %self.node, "node proxy exited ({st}); restarting in {:?}", self.backoff);
                self.child = None;
                self.next_start = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
            }
        }
        if self.child.is_none() && Instant::now() >= self.next_start {
            self.start(paths, node);
        }
    }

    fn start(&mut self, paths: &Paths, node: &Node) {
        let cgroup = paths.node_proxy_cgroup(&node.name);
        if let Err(e) = std::fs::create_dir_all(&cgroup).and_then(|_| std::fs::create_dir_all(paths.state_dir.join("nodes"))) {
            tracing::error!(node = %node.name, "cannot prepare the node proxy: {e}");
            return;
        }
        let exe = std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "slipstream".into());
        let mut env = vec![("PATH".to_string(), spawn::pod_path())];
        // The node proxy's own settings (SLIPSTREAM_NODE_*) pass through, so
        // `SLIPSTREAM_NODE_X=... slipstream up` configures every node proxy.
        for (k, v) in std::env::vars() {
            if k.starts_with("SLIPSTREAM_NODE_") || ["SLIPSTREAM_LOG", "SLIPSTREAM_ACCESS_LOG", "RUST_LOG", "HOME"].contains(&k.as_str()) {
                env.push((k, v));
            }
        }
        let spec = spawn::SandboxSpec {
            argv: vec![
                exe,
                "--cluster".into(),
                paths.cluster.to_string(),
                "node".into(),
                "--node".into(),
                node.name.clone(),
                "--config-dir".into(),
                paths.mesh_dir().display().to_string(),
                "--ca-dir".into(),
                paths.ca_dir().display().to_string(),
            ],
            env,
            cwd: None,
            netns: netns_path(&node.netns),
            cgroup,
            hostname: node.name.clone(),
            hosts: None,
            resolv: None,
            log: Some(paths.node_proxy_log(&node.name)),
            new_session: true,
            private_mounts: false,
        };
        match spawn::spawn(&spec) {
            Ok(c) => {
                if self.started {
                    self.restarts += 1;
                }
                self.started = true;
                tracing::info!(node = %node.name, pid = c.id(), "node proxy started");
                self.child = Some(c);
            }
            Err(e) => {
                tracing::error!(node = %node.name, "cannot start the node proxy: {e}");
                self.next_start = Instant::now() + self.backoff;
            }
        }
    }

    /// Stops the proxy (SIGTERM: it drains), then waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = crate::sys::signals::kill(c.id() as i32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
