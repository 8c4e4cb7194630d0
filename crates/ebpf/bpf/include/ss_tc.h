/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the tc programs of a pod's eth0 decide about packets that are not
 * IPv4 TCP, both ways (tc_ingress.c, tc_egress.c). TCP is decided per
 * connection, at connect() and at the SYN; everything else per flow, here
 * (docs/datapath.md, "UDP, ICMP and the rest"). */
#ifndef SS_TC_H
#define SS_TC_H

#include "ss_lib.h"
#include "ss_parse.h"
#include <linux/ipv6.h>

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/* Folds a 32-bit one's complement sum into a checksum field. */
static __always_inline __u16 ss_csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* Swaps a frame's Ethernet addresses: its answer goes back the way it
 * came. */
static __always_inline void ss_swap_macs(struct ethhdr *eth)
{
	__u8 mac[ETH_ALEN];
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
}

/* Turns a SYN's TCP header (trimmed to 20 bytes) into the RST|ACK a
 * closed port answers it with, acknowledging `ack`; the checksum is left
 * 0 for the caller, who knows the pseudo-header. */
static __always_inline void ss_tcp_to_reset(struct tcphdr *tcp, __u32 ack)
{
	__u16 port = tcp->source;
	tcp->source = tcp->dest;
	tcp->dest = port;
	tcp->seq = 0;
	tcp->ack_seq = bpf_htonl(ack);
	((__u8 *)tcp)[12] = 5 << 4;        /* data offset: no options */
	((__u8 *)tcp)[13] = 0x04 | 0x10; /* RST, ACK */
	tcp->window = 0;
	tcp->urg_ptr = 0;
	tcp->check = 0;
}

/* Answers an IPv6 TCP SYN with the RST a closed port would send, out of
 * the interface it came in on, so the client fails at once (as the
 * IPv4 answer in tc_ingress.c does): trimmed to bare headers, addresses
 * and ports swapped, RST|ACK, checksum whole. A SYN behind extension
 * headers, or without options, is dropped instead. */
static __always_inline int ss_answer_reset6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip6 + 1);
	if ((void *)(tcp + 1) > end || ip6->nexthdr != IPPROTO_TCP || !tcp->syn || tcp->ack)
		return TC_ACT_SHOT;
	__u32 seg = bpf_ntohs(ip6->payload_len) - tcp->doff * 4;
	__u32 ack = bpf_ntohl(tcp->seq) + 1 + seg;
	if (skb->len <= sizeof(*eth) + sizeof(*ip6) + sizeof(*tcp))
		return TC_ACT_SHOT;
	if (bpf_skb_change_tail(skb, sizeof(*eth) + sizeof(*ip6) + sizeof(*tcp), 0))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	ip6 = (void *)(eth + 1);
	tcp = (void *)(ip6 + 1);
	if ((void *)(tcp + 1) > end)
		return TC_ACT_SHOT;

	ss_swap_macs(eth);
	struct in6_addr a = ip6->saddr;
	ip6->saddr = ip6->daddr;
	ip6->daddr = a;
	ip6->priority = 0;
	ip6->flow_lbl[0] = 0;
	ip6->flow_lbl[1] = 0;
	ip6->flow_lbl[2] = 0;
	ip6->payload_len = bpf_htons(sizeof(*tcp));
	ip6->hop_limit = 64;

	ss_tcp_to_reset(tcp, ack);
	struct {
		struct in6_addr saddr, daddr;
		__u32 len;
		__u8 zero[3];
		__u8 proto;
	} pseudo = { .saddr = ip6->saddr, .daddr = ip6->daddr, .len = bpf_htonl(sizeof(*tcp)), .proto = IPPROTO_TCP };
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	tcp->check = ss_csum_fold(bpf_csum_diff(0, 0, (__be32 *)tcp, sizeof(*tcp), (__u32)sum));
	return bpf_redirect(skb->ifindex, 0);
}

/* A packet that is not IPv4 on a pod's eth0: IPv6 is refused on meshed
 * pods (the mesh carries IPv4 only, so IPv6 would go around it and around
 * STRICT mTLS): a SYN coming in is answered with a reset, anything else
 * but neighbour discovery dropped, counted under SS_DROP_IPV6. What is
 * neither IPv4 nor IPv6 (ARP) passes. A frame to a multicast address
 * names no pod and passes: only the node shares a link with a pod (IPv6
 * link-local is not routed between pods), and the pods' own sockets are
 * refused at connect6/sendmsg6. */
/* Pulls a packet's first headers (Ethernet, IPv4 and TCP with their
 * options: 134 bytes at most) into the linear data, where the parsers read
 * them: an AF_PACKET TX ring, or a GRO'd packet, may hold them in page
 * fragments. 0 when done. */
static __always_inline long ss_pull_headers(struct __sk_buff *skb)
{
	__u32 want = skb->len < 134 ? skb->len : 134;
	return bpf_skb_pull_data(skb, want);
}

static __always_inline int ss_tc_not_ip4(struct __sk_buff *skb, int ingress)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	/* Neighbour discovery passes: without it no SYN ever arrives to be
	 * answered, and clients wait for a timeout. It carries no app's byte. */
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) + 1 <= end && ip6->nexthdr == IPPROTO_ICMPV6) {
		__u8 type = *(__u8 *)(ip6 + 1);
		if (type == 135 /* neighbour solicitation */ || type == 136 /* advertisement */)
			return TC_ACT_OK;
	}
	/* Going out, a bare reset passes: the answer ss_answer_reset6 sends
	 * back out of eth0 meets this program too. It carries no byte of an
	 * app's (20 bytes of TCP header, RST without SYN, FIN, PSH or URG). */
	if (!ingress && (void *)(ip6 + 1) + sizeof(struct tcphdr) <= end && ip6->nexthdr == IPPROTO_TCP &&
	    ip6->payload_len == bpf_htons(sizeof(struct tcphdr))) {
		__u8 flags = ((__u8 *)(ip6 + 1))[13];
		if ((flags & (0x01 | 0x02 | 0x04 | 0x08 | 0x20)) == 0x04)
			return TC_ACT_OK;
	}
	/* The pod, by its eth0's address: the frame's destination coming in,
	 * its source going out (the netns cookie of a packet coming in is
	 * not the pod's: it has no socket yet). */
	struct ss_mac_key k = { .pad = 0 };
	__builtin_memcpy(k.addr, ingress ? eth->h_dest : eth->h_source, ETH_ALEN);
	struct ss_pod *pod = bpf_map_lookup_elem(&ss_macs_v1, &k);
	if (!pod || !(pod->flags & SS_POD_MESHED))
		return TC_ACT_OK;
	ss_count_drop(pod->node, SS_DROP_IPV6);
	return ingress ? ss_answer_reset6(skb) : TC_ACT_SHOT;
}

/* Whether an ICMP error (`p`) concerns a live flow of the pod at
 * `pod_ip`: coming in (`ingress`), the packet it quotes is one the pod
 * sent (a UDP or SCTP flow, an echo, or a TCP connection the pod has a
 * socket for); going out, one the pod received (a flow the pod took part
 * in). Anything else is no answer to anything and meets the policy. */
static __always_inline int ss_icmp_error_of_flow(struct __sk_buff *skb, struct ss_pkt4 *p, __u32 pod_ip, int ingress)
{
	__u32 own = ingress ? p->inner_saddr : p->inner_daddr;
	__u32 peer = ingress ? p->inner_daddr : p->inner_saddr;
	if (own != pod_ip || !p->inner_proto)
		return 0;
	if (p->inner_proto == IPPROTO_TCP) {
		if (!ingress)
			return 0;
		/* The connection as its packets coming in would name it. */
		struct bpf_sock_tuple t = {};
		t.ipv4.saddr = peer;
		t.ipv4.daddr = own;
		t.ipv4.sport = bpf_htons(p->inner_dport);
		t.ipv4.dport = bpf_htons(p->inner_sport);
		struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 0;
		int connected = sk->state != BPF_TCP_LISTEN;
		bpf_sk_release(sk);
		return connected;
	}
	struct ss_flow_key k = { .pod_ip = pod_ip, .peer_ip = peer, .proto = p->inner_proto };
	if (p->inner_proto == IPPROTO_ICMP) {
		k.pod_port = p->inner_sport;
	} else {
		k.pod_port = ingress ? p->inner_sport : p->inner_dport;
		k.peer_port = ingress ? p->inner_dport : p->inner_sport;
	}
	return ss_flow_live(&k, 0);
}

/* A non-TCP IPv4 packet of a pod on the datapath at its eth0 (`ingress`:
 * the pod is the destination; else the source): 1 passes, 0 drops.
 * A packet of a live flow of the pod passes (a reply, or more of a flow
 * policy allowed); so does an ICMP error about one of the pod's live
 * flows or connections, both ways, and a fragment after the first.
 * Anything else is looked up in the policy map in the pod's node's
 * numbering (UDP and SCTP by port, the rest at port 0 under
 * SS_PROTO_OTHER); allowed, its flow is noted so its replies pass and
 * recorded as FORWARDED (once per flow and end, not per packet). */
static __always_inline int ss_tc_flow(struct __sk_buff *skb, struct ss_pkt4 *p, int ingress)
{
	__u32 pod_ip = ingress ? p->daddr : p->saddr;
	__u32 peer_ip = ingress ? p->saddr : p->daddr;
	struct ss_local *local = bpf_map_lookup_elem(&ss_local_v1, &pod_ip);
	if (!local)
		return 1; /* not one of our pods' addresses: broadcast, a route through */
	/* A pod enrolled by an older datapath has no egress program to note
	 * its flows: what is not TCP stays the nftables table's for it. */
	if (!(local->flags & SS_POD_FLOWS))
		return 1;
	if (ss_is_loopback(peer_ip) || peer_ip == pod_ip || peer_ip == 0)
		return 1;
	/* A fragment after the first carries no ports: its first fragment was
	 * decided, and without it the stack never reassembles this one. */
	if (p->frag_later)
		return 1;
	if (p->icmp_error && ss_icmp_error_of_flow(skb, p, pod_ip, ingress))
		return 1;
	struct ss_flow_key k = { .pod_ip = pod_ip, .peer_ip = peer_ip, .proto = p->proto };
	__u8 pproto = SS_PROTO_OTHER;
	__u16 dport = 0;
	if (p->proto == IPPROTO_UDP || p->proto == IPPROTO_SCTP) {
		k.pod_port = ingress ? p->dport : p->sport;
		k.peer_port = ingress ? p->sport : p->dport;
		pproto = p->proto;
		dport = p->dport;
	} else if (p->proto == IPPROTO_ICMP && (p->icmp_type == SS_ICMP_ECHO || p->icmp_type == SS_ICMP_ECHOREPLY)) {
		k.pod_port = p->sport;
	}
	if (ss_flow_live(&k, 1))
		return 1;
	struct ss_policy_value *v = ss_policy_lookup_proto(pproto, local->node, p->saddr, p->daddr, dport);
	if (v && v->verdict == SS_POLICY_DENY) {
		ss_count_drop(local->node, SS_DROP_POLICY_DENIED);
		ss_emit_proto(p->proto, 0, p->saddr, p->sport, p->daddr, dport, SS_VERDICT_DROPPED, SS_DROP_POLICY_DENIED,
			      ingress ? SS_POINT_TC_INGRESS : SS_POINT_TC_EGRESS, v->rule, local->node);
		return 0;
	}
	ss_flow_note(&k);
	ss_emit_proto(p->proto, 0, p->saddr, p->sport, p->daddr, dport, SS_VERDICT_FORWARDED, 0,
		      ingress ? SS_POINT_TC_INGRESS : SS_POINT_TC_EGRESS, 0, local->node);
	return 1;
}

#endif
