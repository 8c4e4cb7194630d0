/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The datapath ABI: every map, struct, verdict and drop reason that the BPF
 * programs and the Rust side (crates/ebpf/src/abi.rs) share. The Rust
 * mirror of each struct has a layout test; change one side, change both.
 *
 * Rules (docs/datapath.md, "The ABI"):
 * - A map's layout never changes under its name: a new layout is a new
 *   name (the _v1 suffix), so a program and a node proxy of different
 *   versions never read each other's bytes wrongly.
 * - Explicit padding, no implicit holes: every struct is a multiple of 8
 *   bytes and every field sits at its natural alignment.
 * - Verdicts and drop reasons are never renumbered; new ones are appended.
 * - Addresses are in network byte order (as the kernel hands them over),
 *   ports in host byte order.
 */
#ifndef SS_ABI_H
#define SS_ABI_H

#include <linux/types.h>

#define SS_ABI_VERSION 1

/* The numbers shared with the node proxy and nftables capture
 * (crates/core/src/abi.rs). */
#define SS_OUTBOUND_PORT 15001
#define SS_INBOUND_PLAINTEXT_PORT 15006
#define SS_HBONE_PORT 15008
#define SS_PROXY_MARK 1337 /* 0x539: the node proxy's and the tools' sockets */
#define SS_INPOD_MARK 273  /* 0x111: the node proxy's transparent sockets */
#define SS_MARK_MASK 4095  /* 0xfff */

/* How many nodes the per-node counters can tell apart (one kernel may
 * host several nodes of the local cluster). */
#define SS_MAX_NODES 64

/* A pod whose sockets the connect hook sees, by the cookie of its network
 * namespace (map ss_pods_v1): whatever process opens a socket in the
 * pod's namespace is the pod, as with per-namespace nftables capture.
 * Written by the agent when the pod starts. */
struct ss_pod {
	__u32 ip;    /* the pod's IPv4 address, network order */
	__u16 node;  /* index of the pod's node, < SS_MAX_NODES */
	__u16 flags; /* SS_POD_* */
};

/* The pod's outbound connections go to its node proxy. */
#define SS_POD_MESHED 1
/* Both tc programs are on the pod (enrolled by this datapath version):
 * the programs decide its traffic that is not TCP, per flow. */
#define SS_POD_FLOWS 2

/* A local pod by address (map ss_local_v1), for the programs that see
 * packets rather than processes. */
struct ss_local {
	__u16 node;
	__u16 flags; /* SS_POD_* */
	__u32 pad;
};

/* A local pod by the hardware address of its eth0 (map ss_macs_v1, value
 * struct ss_pod), for what the tc programs see without an IPv4 header
 * (IPv6). */
struct ss_mac_key {
	__u8 addr[6];
	__u16 pad;
};

/* An address and port (service endpoints in ss_backends_v1, the address
 * a balanced socket dialed in ss_lbsock_v1). */
struct ss_origdst {
	__u32 ip;   /* network order */
	__u16 port; /* host order */
	__u16 pad;
};

/* Where a captured connection was going (maps ss_connect_v2, keyed by the
 * socket cookie, and ss_origdst_v3, keyed by ss_origdst_key): the address
 * the app dialed and, when it dialed a service, the ready endpoint chosen
 * at connect() (ep_ip 0: none chosen, the node proxy picks). */
struct ss_steer {
	__u32 ip;      /* dialed, network order */
	__u16 port;    /* dialed, host order */
	__u16 pad;
	__u32 ep_ip;   /* chosen endpoint, network order; 0 when none */
	__u16 ep_port; /* host order */
	__u16 pad2;
};

/* A captured connection as the node proxy sees it when it accepts: the
 * pod's network namespace and the client socket's own address and port
 * (the accepted socket's peer). Two live sockets of a namespace connected
 * to the proxy's listener never share all three, so an entry is one
 * socket's: another socket that takes the same port (bound to another
 * address) finds nothing under its own key. */
struct ss_origdst_key {
	__u64 netns; /* network namespace cookie (SO_NETNS_COOKIE) */
	__u32 ip;    /* the app socket's local address, network order */
	__u16 port;  /* the app socket's local port, host order */
	__u16 pad;
};

/* An ss_origdst_v3 entry: where the socket was going, and which socket it
 * is (its cookie): removed when that socket closes without the proxy
 * having taken it, so no later socket that reuses its address and port
 * finds it. */
struct ss_origdst_entry {
	struct ss_steer steer;
	__u64 cookie;
};

/* A numeric identity (map ss_ipcache_v1): what policy can tell apart about
 * a workload (its SPIFFE identity, so namespace and service account; the
 * policies that select it, so its labels as selectors see them; the
 * address blocks and peer lists its address falls in), numbered by each
 * node proxy for its node; a service address has one of its own. Keyed by
 * node because one kernel may host several nodes of the local cluster,
 * each numbering on its own. 0 is no identity. */
struct ss_ipcache_key {
	__u16 node;
	__u16 pad;
	__u32 ip; /* network order */
};

/* An address outside the cluster (map ss_world_v1, an LPM trie): the
 * identity of the longest prefix policies name that holds it. prefixlen
 * counts the bits of node and pad (32) and then of the address. */
struct ss_world_key {
	__u32 prefixlen;
	__u16 node;
	__u16 pad;
	__u32 ip; /* network order */
};

/* One policy decision (map ss_policy_v2), between two identities of one
 * node's numbering. dst_port 0 means every port of the pair that has no
 * entry of its own. */
struct ss_policy_key {
	__u16 node;
	__u16 dst_port;
	__u8 proto;   /* IPPROTO_TCP */
	__u8 pad[3];
	__u32 src_id;
	__u32 dst_id;
};

struct ss_policy_value {
	__u8 verdict; /* SS_POLICY_* */
	__u8 flags;   /* SS_POLICY_F_* */
	__u16 pad;
	__u32 rule;   /* the node proxy's reference to the deciding rule */
};

/* On a dst_port 0 deny: no port of the pair is allowed, so a connection
 * whose port the kernel cannot see (HBONE's, inside the tunnel) is denied
 * too. */
#define SS_POLICY_F_ALL_PORTS 1

#define SS_POLICY_ALLOW 1
#define SS_POLICY_DENY 2

/* Connect-time load balancing (maps ss_services_v1, ss_backends_v1):
 * a service address and port, and its ready endpoints by index. */
struct ss_svc_key {
	__u32 vip;  /* network order */
	__u16 port; /* host order */
	__u8 proto; /* IPPROTO_TCP */
	__u8 pad;
};

struct ss_svc {
	__u32 count; /* endpoints at indexes 0..count-1; 0: none ready */
	__u32 pad;
};

struct ss_backend_key {
	__u32 vip;
	__u16 port;
	__u16 index;
};

/* An endpoint: the layout of ss_origdst. Endpoints are the agent's view
 * of the service; the node proxy uses a choice only if its own view holds
 * the endpoint ready too. */

/* A pod's steered connections between connect() and the end of their
 * handshake (map ss_pending_v1, by network namespace cookie): each holds
 * an entry of the original-destination maps, which all pods share, so a
 * pod may hold at most this many at once and cannot push another pod's
 * entries out (the maps hold 16 times as many). Counted once per socket
 * (ss_sockstate_v1, by socket cookie), given back when the handshake
 * ends, fails, or the socket is released. Far above what a legitimate
 * burst holds: the kernel completes a handshake in softirq, which a busy
 * CPU defers, so a client opening thousands of connections in a tight
 * loop (a load generator, a pool warming up) has that many in flight. */
#define SS_MAX_PENDING 16384

struct ss_pending {
	__s32 count; /* signed: a rare racing give-back drifts below 0, never wraps */
	__u32 pad;
};

struct ss_sockstate {
	__u64 netns; /* where the socket was counted */
	__u32 flags; /* SS_SOCK_* */
	__u32 pad;
};

#define SS_SOCK_PENDING 1 /* counted in ss_pending_v1, not given back yet */

/* The protocol of policy entries for what is neither TCP, UDP nor SCTP
 * (ICMP, for one): decided at port 0 by the rules that name no port. */
#define SS_PROTO_OTHER 0

/* A flow a pod on the datapath took part in that is not TCP (map
 * ss_flows_v1): UDP and SCTP by both ports, ICMP echo by its identifier
 * (pod_port; peer_port 0), anything else by the protocol alone. Written
 * when a pod sends (tc egress) or receives (tc ingress) a packet policy
 * allowed; a packet of a flow seen in the last SS_FLOW_TIMEOUT_NS passes
 * both ways without a policy lookup, so replies pass as conntrack lets
 * them (a UDP server isolated for egress still answers its clients). */
struct ss_flow_key {
	__u32 pod_ip;  /* network order */
	__u32 peer_ip; /* network order */
	__u16 pod_port;
	__u16 peer_port;
	__u8 proto;
	__u8 pad[3];
};

struct ss_flow {
	__u64 seen_ns; /* bpf_ktime_get_ns of the last packet */
};

#define SS_FLOW_TIMEOUT_NS (120ULL * 1000 * 1000 * 1000)

/* Verdicts of flow events. Never renumbered. */
#define SS_VERDICT_FORWARDED 1  /* passed on untouched (not meshed) */
#define SS_VERDICT_REDIRECTED 2 /* steered to the node proxy */
#define SS_VERDICT_DROPPED 3

/* Drop reasons. Never renumbered; 0 is not a reason. */
#define SS_DROP_POLICY_DENIED 1 /* the policy maps deny it */
#define SS_DROP_NO_PROXY 2      /* a meshed pod's node proxy is not listening */
#define SS_DROP_NO_ENDPOINT 3   /* a service address with no ready endpoint */
#define SS_DROP_TOO_MANY_PENDING 4 /* the pod has SS_MAX_PENDING steered connects not yet established */
#define SS_DROP_IPV6 5          /* IPv6 from or to a meshed pod: the mesh carries IPv4 only */
#define SS_DROP_FRAGMENT 6      /* TCP to a pod whose TCP header cannot be read whole here: an IP fragment (any, the first too) or a truncated header */
#define SS_DROP_SPOOFED 7       /* IPv4 leaving a pod from an address that is not the pod's own (raw sockets, NET_RAW) */
#define SS_DROP_MAX 8           /* counters per node */

/* Where the verdict was taken. */
#define SS_POINT_CONNECT 1   /* the source's connect() */
#define SS_POINT_TC_INGRESS 2 /* the destination pod's eth0, inbound */
#define SS_POINT_TC_EGRESS 3  /* the source pod's eth0, outbound */

/* One flow event (ring buffer ss_events_v1). */
struct ss_event {
	__u64 time_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 netns;   /* source network namespace cookie, 0 when not known */
	__u32 src_ip;  /* network order; 0 when not known yet (connect) */
	__u32 dst_ip;  /* network order */
	__u16 src_port;
	__u16 dst_port;
	__u8 proto;
	__u8 verdict;  /* SS_VERDICT_* */
	__u8 reason;   /* SS_DROP_* for drops, else 0 */
	__u8 point;    /* SS_POINT_* */
	__u32 rule;
	__u16 node;
	__u16 pad;
};

#endif
