//! The Rust mirror of `bpf/include/ss_abi.h`: the maps' key and value
//! structs, verdicts and drop reasons. The layout tests below hold each
//! struct to the C one (size and every offset), and the constant test reads
//! the header itself, so a change on one side alone fails the build's tests.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};

pub const ABI_VERSION: u32 = 1;
pub const MAX_NODES: u16 = 64;
/// A pod's steered connects not yet established, at most.
pub const MAX_PENDING: u32 = 16384;
pub const DROP_MAX: u32 = 8;

/// Map names, versioned: a new layout is a new name.
pub mod maps {
    pub const PODS: &str = "ss_pods_v1";
    pub const LOCAL: &str = "ss_local_v1";
    pub const CONNECT: &str = "ss_connect_v2";
    pub const ORIGDST: &str = "ss_origdst_v3";
    pub const IPCACHE: &str = "ss_ipcache_v1";
    pub const WORLD: &str = "ss_world_v1";
    pub const POLICY: &str = "ss_policy_v2";
    pub const LISTENERS: &str = "ss_listeners_v1";
    pub const DROPS: &str = "ss_drops_v1";
    pub const EVENTS: &str = "ss_events_v1";
    pub const SERVICES: &str = "ss_services_v1";
    pub const BACKENDS: &str = "ss_backends_v1";
    pub const LBSOCK: &str = "ss_lbsock_v1";
    pub const PENDING: &str = "ss_pending_v1";
    pub const SOCKSTATE: &str = "ss_sockstate_v1";
    pub const FLOWS: &str = "ss_flows_v1";
    pub const MACS: &str = "ss_macs_v1";
    pub const ALL: [&str; 17] = [
        PODS, LOCAL, MACS, CONNECT, ORIGDST, IPCACHE, WORLD, POLICY, LISTENERS, SERVICES, BACKENDS, LBSOCK, PENDING, SOCKSTATE, FLOWS,
        DROPS, EVENTS,
    ];
}

pub const POD_MESHED: u16 = 1;
/// Both tc programs are on the pod: they decide what is not TCP.
pub const POD_FLOWS: u16 = 2;
pub const POLICY_ALLOW: u8 = 1;
pub const POLICY_DENY: u8 = 2;
/// On a port-0 deny: no port of the pair is allowed.
pub const POLICY_F_ALL_PORTS: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;
/// Policy entries of what is neither TCP, UDP nor SCTP (ICMP...), port 0.
pub const PROTO_OTHER: u8 = 0;

/// A flow's verdict. Numbers are fixed forever (append only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Verdict {
    Forwarded = 1,
    Redirected = 2,
    Dropped = 3,
}

/// Why the kernel dropped a connection. Numbers are fixed forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DropReason {
    PolicyDenied = 1,
    NoProxy = 2,
    NoEndpoint = 3,
    TooManyPending = 4,
    Ipv6 = 5,
    /// TCP to a pod whose header cannot be read whole at tc ingress (an IP
    /// fragment, the first too, or a truncated header).
    Fragment = 6,
    /// IPv4 leaving a pod from an address that is not its own.
    Spoofed = 7,
}

impl DropReason {
    pub const ALL: [DropReason; 7] = [
        DropReason::PolicyDenied,
        DropReason::NoProxy,
        DropReason::NoEndpoint,
        DropReason::TooManyPending,
        DropReason::Ipv6,
        DropReason::Fragment,
        DropReason::Spoofed,
    ];

    /// The metric label and `observe` word.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::PolicyDenied => "POLICY_DENIED",
            DropReason::NoProxy => "NO_PROXY",
            DropReason::NoEndpoint => "NO_ENDPOINT",
            DropReason::TooManyPending => "TOO_MANY_PENDING",
            DropReason::Ipv6 => "IPV6",
            DropReason::Fragment => "FRAGMENT",
            DropReason::Spoofed => "SPOOFED",
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|r| *r as u8 == v)
    }
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Forwarded => "FORWARDED",
            Verdict::Redirected => "REDIRECTED",
            Verdict::Dropped => "DROPPED",
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        [Verdict::Forwarded, Verdict::Redirected, Verdict::Dropped].into_iter().find(|x| *x as u8 == v)
    }
}

/// Where a verdict was taken.
pub const POINT_CONNECT: u8 = 1;
pub const POINT_TC_INGRESS: u8 = 2;
pub const POINT_TC_EGRESS: u8 = 3;

/// A pod by its eth0's hardware address (map `ss_macs_v1`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MacKey {
    pub addr: [u8; 6],
    pub pad: u16,
}

/// A non-TCP flow of a pod on the datapath (map `ss_flows_v1`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct FlowKey {
    pub pod_ip: u32,
    pub peer_ip: u32,
    pub pod_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flow {
    pub seen_ns: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pod {
    pub ip: u32,
    pub node: u16,
    pub flags: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Local {
    pub node: u16,
    pub flags: u16,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OrigDst {
    pub ip: u32,
    pub port: u16,
    pub pad: u16,
}

/// A pod's count of steered connects not yet established.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending {
    pub count: i32,
    pub pad: u32,
}

/// A pending socket, by its cookie: where it was counted, and flags.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SockState {
    pub netns: u64,
    pub flags: u32,
    pub pad: u32,
}

pub const SOCK_PENDING: u32 = 1;

/// Where a steered connection was going: the address dialed and, for a
/// service, the endpoint chosen at connect() (`ep_ip` 0: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Steer {
    pub ip: u32,
    pub port: u16,
    pub pad: u16,
    pub ep_ip: u32,
    pub ep_port: u16,
    pub pad2: u16,
}

/// A captured connection's key: the pod's network namespace and the
/// client socket's own address (`ip_key` order) and port.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct OrigDstKey {
    pub netns: u64,
    pub ip: u32,
    pub port: u16,
    pub pad: u16,
}

/// An `ss_origdst_v3` entry: the steering, and the client socket's cookie.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OrigDstEntry {
    pub steer: Steer,
    pub cookie: u64,
}

/// An address in one node's identity numbering.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct IpcacheKey {
    pub node: u16,
    pub pad: u16,
    pub ip: u32,
}

/// The data of an `ss_world_v1` key (aya's LPM key adds the prefix length
/// before it: 32 bits of node and pad, then the address's).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct WorldAddr {
    pub node: u16,
    pub pad: u16,
    pub ip: u32,
}

/// A decision between two identities of one node's numbering.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    pub node: u16,
    pub dst_port: u16,
    pub proto: u8,
    pub pad: [u8; 3],
    pub src_id: u32,
    pub dst_id: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyValue {
    pub verdict: u8,
    pub flags: u8,
    pub pad: u16,
    pub rule: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct SvcKey {
    pub vip: u32,
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Svc {
    pub count: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct BackendKey {
    pub vip: u32,
    pub port: u16,
    pub index: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    pub time_ns: u64,
    /// The source's network namespace cookie (0 when not known).
    pub netns: u64,
    pub src_ip: u32,
    pub dst_ip: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
    pub verdict: u8,
    pub reason: u8,
    pub point: u8,
    pub rule: u32,
    pub node: u16,
    pub pad: u16,
}

/// An address as the maps hold it: network byte order in a native u32.
pub fn ip_key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ip_from_key(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

impl PolicyKey {
    pub fn tcp(node: u16, src_id: u32, dst_id: u32, port: u16) -> Self {
        Self::new(IPPROTO_TCP, node, src_id, dst_id, port)
    }

    pub fn udp(node: u16, src_id: u32, dst_id: u32, port: u16) -> Self {
        Self::new(IPPROTO_UDP, node, src_id, dst_id, port)
    }

    pub fn new(proto: u8, node: u16, src_id: u32, dst_id: u32, port: u16) -> Self {
        PolicyKey { node, dst_port: port, proto, pad: [0; 3], src_id, dst_id }
    }
}

impl IpcacheKey {
    pub fn new(node: u16, ip: Ipv4Addr) -> Self {
        IpcacheKey { node, pad: 0, ip: ip_key(ip) }
    }
}

impl PolicyValue {
    pub fn deny(rule: u32, flags: u8) -> Self {
        PolicyValue { verdict: POLICY_DENY, flags, pad: 0, rule }
    }

    pub fn allow() -> Self {
        PolicyValue { verdict: POLICY_ALLOW, flags: 0, pad: 0, rule: 0 }
    }
}

impl OrigDst {
    pub fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(ip_from_key(self.ip), self.port)
    }
}

impl Steer {
    pub fn dialed(&self) -> SocketAddrV4 {
        SocketAddrV4::new(ip_from_key(self.ip), self.port)
    }

    pub fn endpoint(&self) -> Option<SocketAddrV4> {
        (self.ep_ip != 0).then(|| SocketAddrV4::new(ip_from_key(self.ep_ip), self.ep_port))
    }
}

impl Event {
    /// Reads an event from a ring buffer record (None if it is short).
    pub fn parse(b: &[u8]) -> Option<Event> {
        if b.len() < std::mem::size_of::<Event>() {
            return None;
        }
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Some(Event {
            time_ns: u64_at(0),
            netns: u64_at(8),
            src_ip: u32_at(16),
            dst_ip: u32_at(20),
            src_port: u16_at(24),
            dst_port: u16_at(26),
            proto: b[28],
            verdict: b[29],
            reason: b[30],
            point: b[31],
            rule: u32_at(32),
            node: u16_at(36),
            pad: u16_at(38),
        })
    }
}

// SAFETY: each is repr(C), made of integers only, with explicit padding
// fields and no implicit holes (the layout tests check sizes and offsets),
// so every bit pattern is a valid value and none leaks uninitialised bytes.
unsafe impl aya::Pod for Pod {}
// SAFETY: as above.
unsafe impl aya::Pod for Local {}
// SAFETY: as above.
unsafe impl aya::Pod for OrigDst {}
// SAFETY: as above.
unsafe impl aya::Pod for Steer {}
// SAFETY: as above.
unsafe impl aya::Pod for Pending {}
// SAFETY: as above.
unsafe impl aya::Pod for SockState {}
// SAFETY: as above.
unsafe impl aya::Pod for OrigDstKey {}
// SAFETY: repr(C), plain integers, no padding (checked by `layouts`).
unsafe impl aya::Pod for OrigDstEntry {}
// SAFETY: as above.
unsafe impl aya::Pod for PolicyKey {}
// SAFETY: as above.
unsafe impl aya::Pod for IpcacheKey {}
// SAFETY: as above.
unsafe impl aya::Pod for WorldAddr {}
// SAFETY: as above.
unsafe impl aya::Pod for PolicyValue {}
// SAFETY: as above.
unsafe impl aya::Pod for SvcKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Svc {}
// SAFETY: as above.
unsafe impl aya::Pod for BackendKey {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowKey {}
// SAFETY: as above.
unsafe impl aya::Pod for MacKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Flow {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // The C side's sizes and offsets (bpf/include/ss_abi.h), written out
    // from the header: natural alignment, explicit padding.
    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(size_of::<Pod>(), 8);
        assert_eq!((offset_of!(Pod, ip), offset_of!(Pod, node), offset_of!(Pod, flags)), (0, 4, 6));
        assert_eq!(size_of::<Local>(), 8);
        assert_eq!((offset_of!(Local, node), offset_of!(Local, flags), offset_of!(Local, pad)), (0, 2, 4));
        assert_eq!(size_of::<OrigDst>(), 8);
        assert_eq!((offset_of!(OrigDst, ip), offset_of!(OrigDst, port), offset_of!(OrigDst, pad)), (0, 4, 6));
        assert_eq!(size_of::<Pending>(), 8);
        assert_eq!(size_of::<FlowKey>(), 16);
        assert_eq!(
            (
                offset_of!(FlowKey, pod_ip),
                offset_of!(FlowKey, peer_ip),
                offset_of!(FlowKey, pod_port),
                offset_of!(FlowKey, peer_port),
                offset_of!(FlowKey, proto)
            ),
            (0, 4, 8, 10, 12)
        );
        assert_eq!(size_of::<Flow>(), 8);
        assert_eq!((size_of::<MacKey>(), offset_of!(MacKey, addr), offset_of!(MacKey, pad)), (8, 0, 6));
        assert_eq!((offset_of!(Pending, count), offset_of!(Pending, pad)), (0, 4));
        assert_eq!(size_of::<SockState>(), 16);
        assert_eq!((offset_of!(SockState, netns), offset_of!(SockState, flags), offset_of!(SockState, pad)), (0, 8, 12));
        assert_eq!(size_of::<Steer>(), 16);
        assert_eq!(
            (
                offset_of!(Steer, ip),
                offset_of!(Steer, port),
                offset_of!(Steer, pad),
                offset_of!(Steer, ep_ip),
                offset_of!(Steer, ep_port),
                offset_of!(Steer, pad2)
            ),
            (0, 4, 6, 8, 12, 14)
        );
        assert_eq!(size_of::<OrigDstKey>(), 16);
        assert_eq!(
            (offset_of!(OrigDstKey, netns), offset_of!(OrigDstKey, ip), offset_of!(OrigDstKey, port), offset_of!(OrigDstKey, pad)),
            (0, 8, 12, 14)
        );
        assert_eq!(size_of::<OrigDstEntry>(), 24);
        assert_eq!((offset_of!(OrigDstEntry, steer), offset_of!(OrigDstEntry, cookie)), (0, 16));
        assert_eq!(size_of::<aya::maps::lpm_trie::Key<WorldAddr>>(), 12);
        assert_eq!((offset_of!(WorldAddr, node), offset_of!(WorldAddr, pad), offset_of!(WorldAddr, ip)), (0, 2, 4));
        assert_eq!(size_of::<IpcacheKey>(), 8);
        assert_eq!((offset_of!(IpcacheKey, node), offset_of!(IpcacheKey, pad), offset_of!(IpcacheKey, ip)), (0, 2, 4));
        assert_eq!(size_of::<PolicyKey>(), 16);
        assert_eq!(
            (
                offset_of!(PolicyKey, node),
                offset_of!(PolicyKey, dst_port),
                offset_of!(PolicyKey, proto),
                offset_of!(PolicyKey, pad),
                offset_of!(PolicyKey, src_id),
                offset_of!(PolicyKey, dst_id)
            ),
            (0, 2, 4, 5, 8, 12)
        );
        assert_eq!(size_of::<PolicyValue>(), 8);
        assert_eq!(
            (offset_of!(PolicyValue, verdict), offset_of!(PolicyValue, flags), offset_of!(PolicyValue, pad), offset_of!(PolicyValue, rule)),
            (0, 1, 2, 4)
        );
        assert_eq!(size_of::<SvcKey>(), 8);
        assert_eq!((offset_of!(SvcKey, vip), offset_of!(SvcKey, port), offset_of!(SvcKey, proto)), (0, 4, 6));
        assert_eq!(size_of::<Svc>(), 8);
        assert_eq!(size_of::<BackendKey>(), 8);
        assert_eq!((offset_of!(BackendKey, vip), offset_of!(BackendKey, port), offset_of!(BackendKey, index)), (0, 4, 6));
        assert_eq!(size_of::<Event>(), 40);
        assert_eq!(
            [
                offset_of!(Event, netns),
                offset_of!(Event, src_ip),
                offset_of!(Event, dst_ip),
                offset_of!(Event, src_port),
                offset_of!(Event, dst_port),
                offset_of!(Event, proto),
                offset_of!(Event, verdict),
                offset_of!(Event, reason),
                offset_of!(Event, point),
                offset_of!(Event, rule),
                offset_of!(Event, node)
            ],
            [8, 16, 20, 24, 26, 28, 29, 30, 31, 32, 36]
        );
    }

    fn header() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/include/ss_abi.h")).expect("ss_abi.h")
    }

    fn define(h: &str, name: &str) -> u64 {
        let line = h
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
            .unwrap_or_else(|| panic!("{name} is not defined in ss_abi.h"));
        line.split_whitespace().nth(2).expect("value").parse().unwrap_or_else(|_| panic!("{name}: not a number"))
    }

    #[test]
    fn constants_match_the_c_header() {
        let h = header();
        assert_eq!(define(&h, "SS_ABI_VERSION"), ABI_VERSION as u64);
        assert_eq!(define(&h, "SS_MAX_NODES"), MAX_NODES as u64);
        assert_eq!(define(&h, "SS_DROP_MAX"), DROP_MAX as u64);
        assert_eq!(define(&h, "SS_POD_MESHED"), POD_MESHED as u64);
        assert_eq!(define(&h, "SS_POD_FLOWS"), POD_FLOWS as u64);
        assert_eq!(define(&h, "SS_POLICY_ALLOW"), POLICY_ALLOW as u64);
        assert_eq!(define(&h, "SS_POLICY_DENY"), POLICY_DENY as u64);
        assert_eq!(define(&h, "SS_POLICY_F_ALL_PORTS"), POLICY_F_ALL_PORTS as u64);
        assert_eq!(define(&h, "SS_VERDICT_FORWARDED"), Verdict::Forwarded as u64);
        assert_eq!(define(&h, "SS_VERDICT_REDIRECTED"), Verdict::Redirected as u64);
        assert_eq!(define(&h, "SS_VERDICT_DROPPED"), Verdict::Dropped as u64);
        assert_eq!(define(&h, "SS_DROP_POLICY_DENIED"), DropReason::PolicyDenied as u64);
        assert_eq!(define(&h, "SS_DROP_NO_PROXY"), DropReason::NoProxy as u64);
        assert_eq!(define(&h, "SS_DROP_NO_ENDPOINT"), DropReason::NoEndpoint as u64);
        assert_eq!(define(&h, "SS_DROP_TOO_MANY_PENDING"), DropReason::TooManyPending as u64);
        assert_eq!(define(&h, "SS_MAX_PENDING"), MAX_PENDING as u64);
        assert_eq!(define(&h, "SS_SOCK_PENDING"), SOCK_PENDING as u64);
        assert_eq!(define(&h, "SS_POINT_CONNECT"), POINT_CONNECT as u64);
        assert_eq!(define(&h, "SS_POINT_TC_INGRESS"), POINT_TC_INGRESS as u64);
        assert_eq!(define(&h, "SS_POINT_TC_EGRESS"), POINT_TC_EGRESS as u64);
        assert_eq!(define(&h, "SS_DROP_IPV6"), DropReason::Ipv6 as u64);
        assert_eq!(define(&h, "SS_DROP_FRAGMENT"), DropReason::Fragment as u64);
        assert_eq!(define(&h, "SS_DROP_SPOOFED"), DropReason::Spoofed as u64);
        assert_eq!(define(&h, "SS_PROTO_OTHER"), PROTO_OTHER as u64);
        assert_eq!(define(&h, "SS_OUTBOUND_PORT"), slipstream_core::abi::OUTBOUND_PORT as u64);
        assert_eq!(define(&h, "SS_INBOUND_PLAINTEXT_PORT"), slipstream_core::abi::INBOUND_PLAINTEXT_PORT as u64);
        assert_eq!(define(&h, "SS_HBONE_PORT"), slipstream_core::abi::HBONE_PORT as u64);
        assert_eq!(define(&h, "SS_PROXY_MARK"), slipstream_core::abi::PROXY_MARK as u64);
        assert_eq!(define(&h, "SS_MARK_MASK"), slipstream_core::abi::MARK_MASK as u64);
        assert_eq!(define(&h, "SS_INPOD_MARK"), slipstream_core::abi::INPOD_MARK as u64);
        assert!((DropReason::ALL.len() as u32) < DROP_MAX);
    }

    #[test]
    fn every_map_name_is_declared_in_the_c_maps() {
        let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/include/ss_lib.h")).expect("ss_lib.h");
        for m in maps::ALL {
            assert!(lib.contains(&format!("}} {m} SEC(\".maps\");")), "{m} missing from ss_lib.h");
        }
        assert_eq!(lib.matches("SEC(\".maps\")").count(), maps::ALL.len(), "a map of ss_lib.h has no Rust name");
    }

    #[test]
    fn events_parse_at_the_c_offsets() {
        let mut b = vec![0u8; 40];
        b[0..8].copy_from_slice(&7u64.to_ne_bytes());
        b[20..24].copy_from_slice(&[10, 0, 0, 9]);
        b[26..28].copy_from_slice(&8080u16.to_ne_bytes());
        b[29] = 3;
        b[30] = 1;
        b[36..38].copy_from_slice(&5u16.to_ne_bytes());
        let e = Event::parse(&b).unwrap();
        assert_eq!(
            (e.time_ns, ip_from_key(e.dst_ip), e.dst_port, e.verdict, e.reason, e.node),
            (7, Ipv4Addr::new(10, 0, 0, 9), 8080, 3, 1, 5)
        );
        assert_eq!(Verdict::from_u8(e.verdict), Some(Verdict::Dropped));
        assert_eq!(DropReason::from_u8(e.reason), Some(DropReason::PolicyDenied));
        assert!(Event::parse(&b[..39]).is_none());
    }
}
