//! Traffic capture for the local cluster's meshed pods: the rules are the
//! product's (`slipstream_cni::capture`, the same the node agent installs
//! on Kubernetes), applied here to a pod's namespace by its name under
//! /run/netns. The local cluster's kubelet probes are not rewritten (its
//! pods need no probe exception).

use slipstream_cni::cmd::CmdError;

/// Installs capture in a pod network namespace.
pub fn enable(pod_netns: &str) -> Result<(), CmdError> {
    slipstream_cni::capture::enable(&crate::names::netns_path(pod_netns), None)
}

/// What the eBPF datapath needs in a meshed pod's namespace besides its programs.
pub fn enable_ebpf_support(pod_netns: &str) -> Result<(), CmdError> {
    slipstream_cni::capture::enable_ebpf_support(
        &crate::names::netns_path(pod_netns),
        std::path::Path::new(slipstream_cni::capture::SYSCTL_NET),
    )
}

/// Takes nftables capture out of a pod's namespace (a running pod leaving the mesh).
pub fn disable(pod_netns: &str) -> Result<(), CmdError> {
    slipstream_cni::capture::disable(&crate::names::netns_path(pod_netns))
}
