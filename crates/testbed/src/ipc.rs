//! CLI <-> agent: one JSON request line, one JSON answer line, over the Unix
//! socket in the cluster's state directory.

use crate::status::ClusterStatus;
use serde::{Deserialize, Serialize};
use slipstream_k8s::{Object, ObjectKey};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Requests are small except applies; bound what the agent will read.
pub const MAX_MESSAGE: u64 = 64 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    Apply {
        objects: Vec<Object>,
    },
    Delete {
        keys: Vec<ObjectKey>,
        ignore_not_found: bool,
    },
    Status,
    /// Every object as the API server would serve it (`get`).
    Objects,
    /// `label` / `annotate`: set (`Some`) or remove (`None`) keys of one
    /// object's labels or annotations.
    Label {
        kind: String,
        namespace: String,
        name: String,
        changes: Vec<(String, Option<String>)>,
        overwrite: bool,
        annotate: bool,
    },
    /// `rollout restart`: replace a Deployment's pods, new ones first.
    Restart {
        namespace: String,
        name: String,
    },
    /// Stop every pod gracefully, remove the network, exit.
    Shutdown,
    /// The datapath's flows after sequence number `after` (0: all kept).
    Flows {
        after: u64,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Response {
    /// One line per object: `deployment.apps/echo created`.
    Done {
        lines: Vec<String>,
    },
    Status {
        status: Box<ClusterStatus>,
    },
    /// Nothing was changed.
    Rejected {
        errors: Vec<String>,
    },
    Objects {
        items: Vec<serde_json::Value>,
    },
    Flows {
        flows: Vec<Flow>,
        /// The datapath that runs (`ebpf`; `nftables` records no flows).
        datapath: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("the cluster agent is not running (no answer on {0}); start a cluster with `slipstream up`")]
    NotRunning(String),
    #[error("permission denied on {0}: the cluster belongs to root; run the command with sudo")]
    PermissionDenied(String),
    #[error("talking to the cluster agent failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("a message between the CLI and the cluster agent cannot be decoded (are both the same slipstream version?): {0}")]
    Decode(#[from] serde_json::Error),
}

pub fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<Response, IpcError> {
    let mut s = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => IpcError::PermissionDenied(socket.display().to_string()),
        _ => IpcError::NotRunning(socket.display().to_string()),
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut answer = String::new();
    BufReader::new(s.take(MAX_MESSAGE)).read_line(&mut answer)?;
    if answer.is_empty() {
        return Err(IpcError::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the agent closed the connection")));
    }
    Ok(serde_json::from_str(&answer)?)
}

pub fn read_request(s: &UnixStream) -> Result<Request, IpcError> {
    let mut line = String::new();
    BufReader::new(s.take(MAX_MESSAGE)).read_line(&mut line)?;
    Ok(serde_json::from_str(&line)?)
}

pub fn write_response(mut s: &UnixStream, r: &Response) -> Result<(), IpcError> {
    let mut line = serde_json::to_vec(r)?;
    line.push(b'\n');
    s.write_all(&line)?;
    Ok(())
}

// The flow log's records, as the agent answers them to `observe`
// (kept by `agent::flows`).

/// One end of a flow, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub ip: String,
    pub port: u16,
    /// `namespace/name` of the pod, empty when the address is no pod's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// SPIFFE identity of a meshed pod's service account.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// `namespace/name` of the service whose address this is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    /// Increases by one per flow; `observe -f` asks for the ones after.
    pub seq: u64,
    /// When the agent read it, Unix milliseconds.
    pub time_ms: u64,
    pub node: String,
    pub source: Endpoint,
    pub destination: Endpoint,
    /// FORWARDED, REDIRECTED or DROPPED.
    pub verdict: String,
    /// For drops: POLICY_DENIED, NO_PROXY.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub drop_reason: String,
    /// Where: `connect` (the source's connect() or sendmsg()),
    /// `tc-ingress` (the destination pod's interface) or `tc-egress` (the
    /// source pod's).
    pub point: String,
    /// TCP, UDP, SCTP, ICMP, or the IP protocol number.
    #[serde(default)]
    pub protocol: String,
}
