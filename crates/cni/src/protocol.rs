//! What the CNI plugin and the node agent say to each other over the
//! agent's Unix socket: one JSON line each way per call.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The file name of the agent's socket in its run directory.
pub const SOCKET: &str = "cni.sock";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Command {
    Add,
    Del,
}

/// One CNI call for one pod, as the kubelet's runtime made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub command: Command,
    pub container_id: String,
    /// `CNI_NETNS`: the path of the pod's network namespace (empty on a
    /// DEL after the namespace is gone).
    pub netns: String,
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID` when the runtime passes it.
    pub uid: String,
    /// The pod's addresses from the primary CNI's result.
    pub ips: Vec<IpAddr>,
}

/// The agent's answer: `ok` once the pod's capture is installed and its
/// listeners are bound (or it is not meshed), else why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub message: String,
}

impl Reply {
    pub fn ok(message: impl Into<String>) -> Reply {
        Reply { ok: true, message: message.into() }
    }
    pub fn refused(message: impl Into<String>) -> Reply {
        Reply { ok: false, message: message.into() }
    }
}
