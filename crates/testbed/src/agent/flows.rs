//! The flow log (Hubble's role on a node): the agent reads the datapath's
//! flow events on a thread, names each end from its pod table when the
//! event arrives (a pod deleted later still shows by name), and keeps the
//! newest [`CAPACITY`] for `slipstream observe`.

pub use crate::ipc::{Endpoint, Flow};
use slipstream_ebpf::abi::{self, DropReason, Event, Verdict};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// Flows kept for `observe` (as `hubble observe` shows a node's recent
/// flows, then follows).
pub const CAPACITY: usize = 8192;

/// A pod, or a service address (empty identity), as the flow log names it.
#[derive(Debug, Clone)]
pub struct PodName {
    pub ip: Ipv4Addr,
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub service: bool,
}

#[derive(Debug, Default)]
pub struct FlowLog {
    flows: VecDeque<Flow>,
    next_seq: u64,
    rx: Option<mpsc::Receiver<Event>>,
}

impl FlowLog {
    /// Starts the reader thread on the ring buffer under `bpf_dir`.
    pub fn start(bpf_dir: &Path) -> Result<FlowLog, String> {
        let mut reader = slipstream_ebpf::FlowReader::open(bpf_dir).map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::sync_channel(CAPACITY);
        std::thread::Builder::new()
            .name("flows".into())
            .spawn(move || loop {
                for e in reader.read(Duration::from_millis(200)) {
                    match tx.try_send(e) {
                        // Full: the agent is busy; this event is lost (the
                        // drop counters still count it).
                        Ok(()) | Err(mpsc::TrySendError::Full(_)) => {}
                        // The agent is gone: so are we.
                        Err(mpsc::TrySendError::Disconnected(_)) => return,
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(FlowLog { flows: VecDeque::new(), next_seq: 1, rx: Some(rx) })
    }

    /// The events read since the last call (none without a reader).
    pub fn take(&mut self) -> Vec<Event> {
        self.rx.as_ref().map(|rx| rx.try_iter().collect()).unwrap_or_default()
    }

    /// Records events, naming their ends.
    pub fn record(&mut self, events: Vec<Event>, pods: &[PodName], nodes: &[String]) {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        for e in events {
            let f = describe(&e, self.next_seq, now, pods, nodes);
            self.next_seq += 1;
            if self.flows.len() == CAPACITY {
                self.flows.pop_front();
            }
            self.flows.push_back(f);
        }
    }

    /// The flows after `after` (all with 0), oldest first.
    pub fn after(&self, after: u64) -> Vec<Flow> {
        self.flows.iter().filter(|f| f.seq > after).cloned().collect()
    }
}

fn endpoint(ip: Ipv4Addr, port: u16, names: &[PodName]) -> Endpoint {
    let found = names.iter().find(|p| p.ip == ip);
    let name = found.map(|p| format!("{}/{}", p.namespace, p.name)).unwrap_or_default();
    let is_service = found.is_some_and(|p| p.service);
    Endpoint {
        ip: ip.to_string(),
        port,
        pod: if is_service { String::new() } else { name.clone() },
        namespace: found.map(|p| p.namespace.clone()).unwrap_or_default(),
        identity: found.map(|p| p.identity.clone()).unwrap_or_default(),
        service: if is_service { name } else { String::new() },
    }
}

/// One event as `observe` shows it (pure, for tests).
pub fn describe(e: &Event, seq: u64, time_ms: u64, pods: &[PodName], nodes: &[String]) -> Flow {
    let verdict = Verdict::from_u8(e.verdict).map(|v| v.as_str().to_string()).unwrap_or_else(|| format!("VERDICT_{}", e.verdict));
    let drop_reason = match Verdict::from_u8(e.verdict) {
        Some(Verdict::Dropped) => {
            DropReason::from_u8(e.reason).map(|r| r.as_str().to_string()).unwrap_or_else(|| format!("REASON_{}", e.reason))
        }
        _ => String::new(),
    };
    let point = match e.point {
        abi::POINT_CONNECT => "connect",
        abi::POINT_TC_INGRESS => "tc-ingress",
        abi::POINT_TC_EGRESS => "tc-egress",
        _ => "unknown",
    };
    let protocol = match e.proto {
        6 => "TCP".to_string(),
        17 => "UDP".to_string(),
        132 => "SCTP".to_string(),
        1 => "ICMP".to_string(),
        n => format!("IP protocol {n}"),
    };
    // Node indexes are 1-based in the local cluster.
    let node = (e.node as usize).checked_sub(1).and_then(|i| nodes.get(i)).cloned().unwrap_or_default();
    Flow {
        seq,
        time_ms,
        node,
        source: endpoint(abi::ip_from_key(e.src_ip), e.src_port, pods),
        destination: endpoint(abi::ip_from_key(e.dst_ip), e.dst_port, pods),
        verdict,
        drop_reason,
        point: point.into(),
        protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_drop_names_both_pods_and_the_reason() {
        let pods = vec![
            PodName {
                ip: Ipv4Addr::new(10, 244, 1, 4),
                namespace: "production".into(),
                name: "legacy".into(),
                identity: "spiffe://cluster.local/ns/production/sa/legacy-sa".into(),
                service: false,
            },
            PodName {
                ip: Ipv4Addr::new(10, 244, 2, 3),
                namespace: "production".into(),
                name: "billing".into(),
                identity: "spiffe://cluster.local/ns/production/sa/billing-sa".into(),
                service: false,
            },
            PodName {
                ip: Ipv4Addr::new(10, 96, 0, 11),
                namespace: "production".into(),
                name: "billing".into(),
                identity: String::new(),
                service: true,
            },
        ];
        let e = Event {
            src_ip: abi::ip_key(Ipv4Addr::new(10, 244, 1, 4)),
            dst_ip: abi::ip_key(Ipv4Addr::new(10, 244, 2, 3)),
            dst_port: 8080,
            proto: abi::IPPROTO_TCP,
            verdict: Verdict::Dropped as u8,
            reason: DropReason::PolicyDenied as u8,
            point: abi::POINT_CONNECT,
            node: 1,
            ..Default::default()
        };
        let f = describe(&e, 7, 1000, &pods, &["node1".into(), "node2".into()]);
        assert_eq!(
            (f.seq, f.node.as_str(), f.verdict.as_str(), f.drop_reason.as_str(), f.point.as_str()),
            (7, "node1", "DROPPED", "POLICY_DENIED", "connect")
        );
        assert_eq!(
            (f.source.pod.as_str(), f.destination.pod.as_str(), f.destination.port),
            ("production/legacy", "production/billing", 8080)
        );
        assert_eq!(f.source.identity, "spiffe://cluster.local/ns/production/sa/legacy-sa");
        let via_vip = Event { dst_ip: abi::ip_key(Ipv4Addr::new(10, 96, 0, 11)), ..e };
        let f = describe(&via_vip, 9, 1000, &pods, &[]);
        assert_eq!((f.destination.pod.as_str(), f.destination.service.as_str()), ("", "production/billing"));
        let unknown = Event { dst_ip: abi::ip_key(Ipv4Addr::new(1, 2, 3, 4)), verdict: Verdict::Redirected as u8, ..e };
        let f = describe(&unknown, 8, 1000, &pods, &[]);
        assert_eq!((f.destination.pod.as_str(), f.drop_reason.as_str(), f.node.as_str()), ("", "", ""));
    }
}
