//! `slipstream status -o json`: a stable interface for scripts and tests,
//! documented in docs/status-json.md. Add fields freely; never rename or
//! remove one without bumping `version`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const STATUS_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    pub version: u32,
    pub cluster: String,
    pub agent: AgentStatus,
    /// Control plane replicas (absent in state files of older agents).
    #[serde(default)]
    pub control: Vec<ControlStatus>,
    pub nodes: Vec<NodeStatus>,
    pub pods: Vec<PodStatus>,
    pub services: Vec<ServiceStatus>,
    /// Objects stored but not acted on (policy and routing kinds).
    #[serde(default)]
    pub other_objects: Vec<String>,
    /// How many times the agent rewrote the objects the control plane
    /// reads; the control plane reports the one it has taken in
    /// (`slipstream apply` waits for it, then for the proxies' ACKs).
    #[serde(default)]
    pub objects_generation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub pid: i32,
    /// False when the status was read from the state file because the agent
    /// is not answering (pod phases are then the last ones it recorded).
    pub running: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    pub netns: String,
    pub ip: String,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyStatus>,
    /// How the node's pods reach its proxy (absent in state files of older
    /// agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath: Option<DatapathStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DatapathStatus {
    /// `ebpf` or `nftables`.
    pub mode: String,
    /// Why eBPF was not used, when it was asked for (`--datapath auto`)
    /// and the kernel could not run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    pub restarts: u32,
    /// Meshed pods of the node whose listeners the proxy has open.
    pub serving: usize,
    pub log: String,
    /// Its readiness probe (`/healthz/ready` on :15021) passes. Absent
    /// (unknown) in a state file written by an agent that did not probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Why it is not ready, when it is not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// One control plane replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlStatus {
    /// control1, control2, ...
    pub name: String,
    pub netns: String,
    /// Where node proxies reach it (`172.18.255.1:15012`).
    pub address: String,
    /// The process: the same fields as a node proxy's (`serving` counts
    /// nothing here and is 0); ready = `/ready` on :15014 passes.
    pub process: ProxyStatus,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Terminating,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub ip: String,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    pub phase: PodPhase,
    pub ready: bool,
    /// Why the pod is not running and ready, when it is not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub restarts: u32,
    pub netns: String,
    /// The node-side end of the pod's veth pair.
    pub veth: String,
    pub cgroup: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// In the mesh: its traffic is carried by the node proxy.
    #[serde(default)]
    pub meshed: bool,
    pub containers: Vec<ContainerStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    /// `waiting`, `running` or `terminated`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    pub ready: bool,
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    pub log: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    pub namespace: String,
    pub name: String,
    /// The cluster IP, or "None" for a headless service.
    pub vip: String,
    pub ports: Vec<ServicePortStatus>,
    pub endpoints: Vec<EndpointStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePortStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub port: u16,
    pub target_port: String,
    pub protocol: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    pub pod: String,
    pub ip: String,
    pub node: String,
    /// The target port on this pod of each service port it serves.
    pub ports: Vec<EndpointPort>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    pub port: u16,
    pub target_port: u16,
}

impl ClusterStatus {
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodStatus> {
        self.pods.iter().find(|p| p.namespace == namespace && p.name == name)
    }
}
