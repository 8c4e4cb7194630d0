//! Pods into and out of the mesh on a node.
//!
//! - [`capture`]: the nftables rules in a pod's network namespace that send
//!   its traffic to the node proxy (the local cluster's agent and the node
//!   agent on Kubernetes both install them from here);
//! - [`enrol`]: whether a pod is meshed, and the next step of a running
//!   pod into or out of the mesh (pure);
//! - [`plugin`]: the CNI plugin `slipstream-cni`, chained after the
//!   cluster's primary CNI; [`protocol`]: what it says to the agent;
//! - [`conflist`]: our entry in the primary CNI's configuration (pure);
//! - [`agent`]: `slipstream node-agent`, the DaemonSet's agent.
//!
//! docs/kubernetes.md says how they fit on a node.

#![forbid(unsafe_code)]

pub mod agent;
pub mod capture;
pub mod cmd;
pub mod conflist;
pub mod datapath;
pub mod enrol;
pub mod plugin;
pub mod protocol;
