//! What the eBPF programs refused, in this proxy's access log (`--datapath
//! ebpf --datapath-drops-log`): a connection the kernel denied at
//! `connect()` or at the destination's interface never reaches a node
//! proxy, so without this it shows only in the drop counters. On
//! Kubernetes, where no agent keeps a flow log, this is what `slipstream
//! observe` reads (through the pods' logs); in the local cluster the agent
//! reads the programs' events instead (one reader only: the ring buffer
//! has one consumer).
//!
//! [`entry`] is the decision (pure: an event, the mesh and the kernel
//! policy's rule texts in, a line out); [`start`] reads the events on a
//! thread and writes the lines.

use crate::telemetry::{AccessLogEntry, Telemetry};
use slipstream_core::sync::LockExt;
use slipstream_core::MeshState;
use slipstream_ebpf::abi::{self, DropReason, Event, Verdict};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The kernel policy's rule texts, by `rule - 1` (what the proxy last
/// wrote to the policy map), shared with the reader.
pub type Rules = Arc<Mutex<Arc<Vec<String>>>>;

/// The access-log line of one event: drops only (what the programs let
/// through reaches a proxy, which logs it itself).
pub fn entry(e: &Event, state: &MeshState, rules: &[String]) -> Option<AccessLogEntry> {
    if Verdict::from_u8(e.verdict) != Some(Verdict::Dropped) {
        return None;
    }
    let reason = DropReason::from_u8(e.reason);
    let (src, dst) = (abi::ip_from_key(e.src_ip), abi::ip_from_key(e.dst_ip));
    let mut out = AccessLogEntry {
        src_addr: SocketAddr::new(IpAddr::V4(src), e.src_port).to_string(),
        dst_addr: SocketAddr::new(IpAddr::V4(dst), e.dst_port).to_string(),
        direction: if e.point == abi::POINT_TC_INGRESS { "inbound" } else { "outbound" },
        ..Default::default()
    };
    if let Some(w) = state.workload_by_ip(IpAddr::V4(src)) {
        out.src_workload = w.name.clone();
        out.src_namespace = w.namespace.clone();
        out.src_identity = w.identity().to_string();
    }
    if let Some(w) = state.workload_by_ip(IpAddr::V4(dst)) {
        out.dst_workload = w.name.clone();
        out.dst_namespace = w.namespace.clone();
        out.dst_identity = w.identity().to_string();
    }
    let point = match e.point {
        abi::POINT_CONNECT => "at connect()",
        abi::POINT_TC_INGRESS => "at the destination's interface",
        _ => "at the source's interface",
    };
    match reason {
        Some(DropReason::PolicyDenied) => {
            let rule = (e.rule as usize).checked_sub(1).and_then(|i| rules.get(i));
            out.error = Some(match rule {
                Some(r) => format!("denied by {r} (in the kernel, {point})"),
                None => format!("denied by a network policy (in the kernel, {point})"),
            });
            out.flag = Some("DENY");
        }
        other => {
            let word = other.map_or("DROPPED", DropReason::as_str);
            out.error = Some(format!("dropped in the kernel {point}: {word}"));
            out.flag = Some(word);
        }
    }
    Some(out)
}

/// Reads the programs' events under `bpf_dir` on a thread of its own and
/// logs each drop; the mesh and the rule texts are read when it comes.
pub fn start(
    bpf_dir: &std::path::Path,
    telemetry: Arc<Telemetry>,
    snapshot: impl Fn() -> Arc<MeshState> + Send + 'static,
    rules: Rules,
) -> anyhow::Result<()> {
    let mut reader = slipstream_ebpf::FlowReader::open(bpf_dir)
        .map_err(|e| anyhow::anyhow!("the datapath's flow events under {}: {e}", bpf_dir.display()))?;
    std::thread::Builder::new().name("kernel-drops".into()).spawn(move || loop {
        let events = reader.read(Duration::from_millis(500));
        if events.iter().all(|e| Verdict::from_u8(e.verdict) != Some(Verdict::Dropped)) {
            continue;
        }
        let (state, rules) = (snapshot(), rules.locked().clone());
        for e in &events {
            // Limited per source as the proxy's own refusals are: a pod
            // looping on a denied connect() (an EPERM costs it nothing)
            // neither floods the log nor pushes others' lines out of it.
            let source = abi::ip_from_key(e.src_ip).to_string();
            if let Some(line) = entry(e, &state, &rules).filter(|_| telemetry.log_refusal(&source)) {
                telemetry.log(&line);
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn event(verdict: Verdict, reason: DropReason, point: u8, rule: u32) -> Event {
        Event {
            src_ip: abi::ip_key(Ipv4Addr::new(10, 244, 1, 4)),
            src_port: 40000,
            dst_ip: abi::ip_key(Ipv4Addr::new(10, 244, 2, 3)),
            dst_port: 8080,
            proto: abi::IPPROTO_TCP,
            verdict: verdict as u8,
            reason: reason as u8,
            point,
            rule,
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_denial_names_its_policy_and_reads_back_as_a_refusal() {
        let state = MeshState::default();
        let rules = vec!["CiliumNetworkPolicy production/billing-l4: spec.ingress[0]".to_string()];
        let e = entry(&event(Verdict::Dropped, DropReason::PolicyDenied, abi::POINT_CONNECT, 1), &state, &rules).unwrap();
        let line = e.render(false);
        assert!(line.starts_with("connection complete src.addr=10.244.1.4:40000 dst.addr=10.244.2.3:8080 direction=outbound"), "{line}");
        assert!(
            line.ends_with(
                "error=\"denied by CiliumNetworkPolicy production/billing-l4: spec.ingress[0] (in the kernel, at connect())\" flag=DENY"
            ),
            "{line}"
        );
        let unknown_rule = entry(&event(Verdict::Dropped, DropReason::PolicyDenied, abi::POINT_TC_INGRESS, 9), &state, &rules).unwrap();
        assert_eq!(
            (unknown_rule.direction, unknown_rule.error.as_deref()),
            ("inbound", Some("denied by a network policy (in the kernel, at the destination's interface)"))
        );
        let no_proxy = entry(&event(Verdict::Dropped, DropReason::NoProxy, abi::POINT_TC_INGRESS, 0), &state, &rules).unwrap();
        assert_eq!(no_proxy.flag, Some("NO_PROXY"));
        assert!(entry(&event(Verdict::Redirected, DropReason::PolicyDenied, abi::POINT_CONNECT, 1), &state, &rules).is_none());
        assert!(entry(&event(Verdict::Forwarded, DropReason::PolicyDenied, abi::POINT_CONNECT, 1), &state, &rules).is_none());
    }
}
