/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps and helpers shared by every program. Logic lives here in small
 * always-inline functions; the .c files only say where they attach. */
#ifndef SS_LIB_H
#define SS_LIB_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ss_abi.h"

/* Hash maps are not preallocated (BPF_F_NO_PREALLOC): an entry costs
 * memory when it exists, not a node's worth of empty slots from the start
 * (about 110 MB of the datapath's 200 MB before; the memory is charged to
 * the node agent's cgroup, which loads them). The LRU maps must be
 * preallocated. */

/* Load-time constant: 0 turns flow events off (counters stay). */
volatile const __u32 ss_events_enabled = 1;

/* Load-time constant: the source address (network order) the node gives
 * the kubelet's probes of meshed pods (Kubernetes' node agent rewrites
 * the node's own connections to it, as Istio does); tc ingress leaves TCP
 * from it to the pod's own stack, around the proxy and the policy, as the
 * nftables capture's exception does. 0 (the local cluster): none. */
volatile const __u32 ss_probe_source = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ss_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_pods_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct ss_local);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_local_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ss_mac_key);
	__type(value, struct ss_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_macs_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, __u64);
	__type(value, struct ss_steer);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_connect_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct ss_origdst_key);
	__type(value, struct ss_origdst_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_origdst_v3 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct ss_ipcache_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_ipcache_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ss_world_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_world_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct ss_policy_key);
	__type(value, struct ss_policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_policy_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32); /* a socket's fd when written, as aya writes it */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_listeners_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ss_svc_key);
	__type(value, struct ss_svc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_services_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct ss_backend_key);
	__type(value, struct ss_origdst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_backends_v1 SEC(".maps");

/* The service address a balanced socket dialed, by socket cookie, for
 * getpeername() (the app sees the address it dialed, not the endpoint). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ss_origdst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_lbsock_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ss_pending);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_pending_v1 SEC(".maps");

/* By socket cookie, while the socket counts as pending: at most
 * SS_MAX_PENDING entries per pod. (Socket-local storage would free itself
 * with the socket; aya 0.13 cannot create it, so sock_release.c does.) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, __u64);
	__type(value, struct ss_sockstate);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_sockstate_v1 SEC(".maps");

/* Non-TCP flows of pods on the datapath, for replies (ss_abi.h). LRU: a
 * flow whose entry was pushed out passes again with its next packet the
 * policy allows, as a conntrack entry that timed out does. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct ss_flow_key);
	__type(value, struct ss_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_flows_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SS_MAX_NODES * SS_DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_drops_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ss_events_v1 SEC(".maps");

static __always_inline int ss_is_loopback(__u32 ip_be)
{
	return (bpf_ntohl(ip_be) >> 24) == 127;
}

static __always_inline void ss_count_drop(__u16 node, __u8 reason)
{
	__u32 k = (__u32)(node % SS_MAX_NODES) * SS_DROP_MAX + reason;
	__u64 *c = bpf_map_lookup_elem(&ss_drops_v1, &k);
	if (c)
		*c += 1;
}

static __always_inline void ss_emit_proto(__u8 proto, __u64 netns, __u32 src_ip, __u16 src_port, __u32 dst_ip,
					  __u16 dst_port, __u8 verdict, __u8 reason, __u8 point, __u32 rule, __u16 node)
{
	if (!ss_events_enabled)
		return;
	struct ss_event *e = bpf_ringbuf_reserve(&ss_events_v1, sizeof(*e), 0);
	if (!e)
		return; /* full: the reader is behind; counters still count */
	e->time_ns = bpf_ktime_get_ns();
	e->netns = netns;
	e->src_ip = src_ip;
	e->dst_ip = dst_ip;
	e->src_port = src_port;
	e->dst_port = dst_port;
	e->proto = proto;
	e->verdict = verdict;
	e->reason = reason;
	e->point = point;
	e->rule = rule;
	e->node = node;
	e->pad = 0;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void ss_emit(__u64 netns, __u32 src_ip, __u16 src_port, __u32 dst_ip, __u16 dst_port,
				    __u8 verdict, __u8 reason, __u8 point, __u32 rule, __u16 node)
{
	ss_emit_proto(IPPROTO_TCP, netns, src_ip, src_port, dst_ip, dst_port, verdict, reason, point, rule, node);
}

/* An address's identity in a node's numbering: a workload's or a
 * service's, else that of the longest prefix policies name for addresses
 * outside the cluster; 0 when it has none. */
static __always_inline __u32 ss_identity(__u16 node, __u32 ip)
{
	struct ss_ipcache_key k = { .node = node, .ip = ip };
	__u32 *id = bpf_map_lookup_elem(&ss_ipcache_v1, &k);
	if (id)
		return *id;
	struct ss_world_key w = { .prefixlen = 64, .node = node, .ip = ip };
	id = bpf_map_lookup_elem(&ss_world_v1, &w);
	return id ? *id : 0;
}

/* The policy entry for a connection, in the numbering of `node` (the
 * source's node at connect(), the destination's at tc ingress): the port's
 * own, else the one for every other port of the pair; NULL when the
 * kernel has no say (an address without identity, or no entry). */
static __always_inline struct ss_policy_value *ss_policy_lookup_proto(__u8 proto, __u16 node, __u32 src_ip, __u32 dst_ip,
								     __u16 dst_port)
{
	__u32 src_id = ss_identity(node, src_ip);
	if (!src_id)
		return NULL;
	__u32 dst_id = ss_identity(node, dst_ip);
	if (!dst_id)
		return NULL;
	struct ss_policy_key k = { .node = node, .dst_port = dst_port, .proto = proto, .src_id = src_id, .dst_id = dst_id };
	struct ss_policy_value *v = bpf_map_lookup_elem(&ss_policy_v2, &k);
	if (v || dst_port == 0)
		return v;
	k.dst_port = 0;
	return bpf_map_lookup_elem(&ss_policy_v2, &k);
}

static __always_inline struct ss_policy_value *ss_policy_lookup(__u16 node, __u32 src_ip, __u32 dst_ip, __u16 dst_port)
{
	return ss_policy_lookup_proto(IPPROTO_TCP, node, src_ip, dst_ip, dst_port);
}

/* The pod a socket address hook's socket belongs to, by its network
 * namespace (*netns set), or NULL: not a pod's, or the node proxy's own
 * sockets in the pod and the capture bypass of the operator's tools
 * (SO_MARK needs CAP_NET_ADMIN, which pods do not have), as with
 * nftables. */
static __always_inline struct ss_pod *ss_pod_of(struct bpf_sock_addr *ctx, __u64 *netns)
{
	*netns = bpf_get_netns_cookie(ctx);
	struct ss_pod *pod = bpf_map_lookup_elem(&ss_pods_v1, netns);
	if (!pod)
		return NULL;
	struct bpf_sock *sk = ctx->sk;
	if (sk && ((sk->mark & SS_MARK_MASK) == SS_PROXY_MARK || (sk->mark & SS_MARK_MASK) == SS_INPOD_MARK))
		return NULL;
	return pod;
}

/* The local port a socket address hook's socket is bound to (0: none
 * yet), host order. */
static __always_inline __u16 ss_sock_port(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	return sk ? (__u16)sk->src_port : 0;
}

/* Whether a flow had a packet in the last SS_FLOW_TIMEOUT_NS; refreshes
 * it when it did (and `refresh`). */
static __always_inline int ss_flow_live(struct ss_flow_key *k, int refresh)
{
	struct ss_flow *f = bpf_map_lookup_elem(&ss_flows_v1, k);
	if (!f)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - f->seen_ns > SS_FLOW_TIMEOUT_NS)
		return 0;
	/* One write a second at most: a busy flow does not bounce the
	 * entry's cache line between CPUs on every packet. */
	if (refresh && now - f->seen_ns > 1000000000ULL)
		f->seen_ns = now;
	return 1;
}

static __always_inline void ss_flow_note(struct ss_flow_key *k)
{
	struct ss_flow f = { .seen_ns = bpf_ktime_get_ns() };
	bpf_map_update_elem(&ss_flows_v1, k, &f, BPF_ANY);
}

/* A socket's real IPv6 destination (not IPv4-mapped; connect6.c,
 * sendmsg6.c): refused (0) for a meshed pod, as the mesh carries IPv4
 * only and IPv6 would go around it; loopback and the unspecified address
 * stay inside the pod, pods outside the mesh go on. */
static __always_inline int ss_ipv6_guard(struct bpf_sock_addr *ctx)
{
	if (!ctx->user_ip6[0] && !ctx->user_ip6[1] && !ctx->user_ip6[2] &&
	    (!ctx->user_ip6[3] || ctx->user_ip6[3] == bpf_htonl(1)))
		return 1;
	__u64 netns;
	struct ss_pod *pod = ss_pod_of(ctx, &netns);
	if (!pod || !(pod->flags & SS_POD_MESHED))
		return 1;
	ss_count_drop(pod->node, SS_DROP_IPV6);
	return 0;
}

/* The pod a dual-stack socket belongs to when it addresses an
 * IPv4-mapped destination (connect6.c, sendmsg6.c), or NULL with *verdict
 * the hook's answer: a real IPv6 destination gets ss_ipv6_guard's, a
 * socket that is no pod's goes on. */
static __always_inline struct ss_pod *ss_pod_of_mapped(struct bpf_sock_addr *ctx, __u64 *netns, int *verdict)
{
	*verdict = 1;
	if (ctx->user_ip6[0] || ctx->user_ip6[1] || ctx->user_ip6[2] != bpf_htonl(0xffff)) {
		*verdict = ss_ipv6_guard(ctx);
		return NULL;
	}
	return ss_pod_of(ctx, netns);
}

/* A pod's UDP datagram or connected UDP socket from its port `sport` (0:
 * not bound yet) towards dst:port (connect4 and sendmsg4): refused (0)
 * when the network policies deny it and it answers no flow of the pod's;
 * UDP is not captured, so this is where a pod's UDP egress policy holds. */
static __always_inline int ss_udp_egress(__u64 netns, struct ss_pod *pod, __u16 sport, __u32 dst, __u16 port)
{
	if (ss_is_loopback(dst) || dst == pod->ip || dst == 0)
		return 1;
	if (sport) {
		struct ss_flow_key k = { .pod_ip = pod->ip, .peer_ip = dst, .pod_port = sport, .peer_port = port, .proto = IPPROTO_UDP };
		if (ss_flow_live(&k, 0))
			return 1;
	}
	struct ss_policy_value *v = ss_policy_lookup_proto(IPPROTO_UDP, pod->node, pod->ip, dst, port);
	if (!v || v->verdict != SS_POLICY_DENY)
		return 1;
	ss_count_drop(pod->node, SS_DROP_POLICY_DENIED);
	ss_emit_proto(IPPROTO_UDP, netns, pod->ip, 0, dst, port, SS_VERDICT_DROPPED, SS_DROP_POLICY_DENIED, SS_POINT_CONNECT,
		      v->rule, pod->node);
	return 0;
}

/* Denied whatever the port (for HBONE, whose port is inside the tunnel):
 * the pair's default is a deny that no port's own entry lifts. */
static __always_inline struct ss_policy_value *ss_policy_all_ports_denied(__u16 node, __u32 src_ip, __u32 dst_ip)
{
	struct ss_policy_value *v = ss_policy_lookup(node, src_ip, dst_ip, 0);
	if (v && v->verdict == SS_POLICY_DENY && (v->flags & SS_POLICY_F_ALL_PORTS))
		return v;
	return NULL;
}

/* Counts a steered socket (by its cookie) against its pod's
 * SS_MAX_PENDING, once: 0 when it may go on, -1 when the pod is at its
 * bound. A socket whose state cannot be stored (the map is full) goes on
 * uncounted: a full map is no reason to refuse a pod. */
static __always_inline int ss_pending_take(__u64 sock, __u64 netns)
{
	if (bpf_map_lookup_elem(&ss_sockstate_v1, &sock))
		return 0; /* counted by an earlier connect() of this socket */
	struct ss_pending *p = bpf_map_lookup_elem(&ss_pending_v1, &netns);
	if (!p) {
		struct ss_pending zero = {};
		bpf_map_update_elem(&ss_pending_v1, &netns, &zero, BPF_NOEXIST);
		p = bpf_map_lookup_elem(&ss_pending_v1, &netns);
		if (!p)
			return 0;
	}
	/* Read, then add: CPUs racing here can pass the bound by at most one
	 * each (an atomic fetch needs a newer instruction set than we ask). */
	if (p->count >= SS_MAX_PENDING)
		return -1;
	struct ss_sockstate st = { .netns = netns, .flags = SS_SOCK_PENDING };
	if (bpf_map_update_elem(&ss_sockstate_v1, &sock, &st, BPF_NOEXIST))
		return 0;
	__sync_fetch_and_add(&p->count, 1);
	return 0;
}

/* Gives a counted socket's place back (its handshake ended, failed, or the
 * socket is gone). Idempotent: the entry is deleted by whoever gets it. */
static __always_inline void ss_pending_give(__u64 sock)
{
	struct ss_sockstate *st = bpf_map_lookup_elem(&ss_sockstate_v1, &sock);
	if (!st)
		return;
	__u64 netns = st->netns;
	if (bpf_map_delete_elem(&ss_sockstate_v1, &sock))
		return; /* another CPU gave it back first */
	struct ss_pending *p = bpf_map_lookup_elem(&ss_pending_v1, &netns);
	if (p)
		__sync_fetch_and_add(&p->count, -1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#endif
