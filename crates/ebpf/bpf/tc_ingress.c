/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tcx ingress of a pod's eth0, in the pod's network namespace.
 *
 * Not TCP (UDP, SCTP, ICMP, the rest): the pod's flows and the policy map,
 * as ss_tc.h decides both ways; IPv6 to a meshed pod is dropped. TCP to a
 * pod whose header cannot be read whole (IP fragments, the first too; a
 * truncated header) is dropped (SS_DROP_FRAGMENT): reassembled by the
 * pod's stack it would reach the app around the capture and the policy.
 *
 * Policy at the destination, before any user-space work: a new TCP
 * connection (a SYN) whose source and destination have identities in the
 * destination node's numbering is looked up like connect4.c does it; a
 * deny drops the SYN, counted and recorded, and answers it with a reset
 * (ss_answer_reset) so the client fails at once. HBONE's port hides the
 * connection's own, so an HBONE SYN is dropped only when no port of the
 * pair is allowed. Sources refused at their own connect() never get here;
 * this holds for the others (a node on nftables, a pod that is not on the
 * datapath, the host). Pods in and outside the mesh alike.
 *
 * Capture, meshed pods only:
 * inbound TCP to the pod's address on any port but HBONE's goes to the
 * node proxy's plaintext listener (0.0.0.0:15006 in the pod, registered by
 * the proxy in ss_listeners_v1 under the pod's address), by assigning the
 * listener to the packet (bpf_sk_assign). The accepted socket keeps the
 * original destination as its local address. Packets of connections that
 * already have a socket (the proxy's accepted ones, HBONE) go their way.
 * Traffic on loopback, the proxy's own connection to the app among it,
 * never passes here. When no listener is registered (the proxy is
 * restarting) the SYN is dropped, so the client retries instead of
 * reaching the app around the proxy.
 */
#include "include/ss_tc.h"

/* Answers a refused SYN with the RST a closed port would send, out of the
 * interface it came in on, so the client fails at once (connection
 * refused) instead of at its connect timeout, as the nftables path's
 * reject does. The packet itself becomes the answer: trimmed to the
 * headers, addresses and ports swapped, RST|ACK acknowledging the SYN
 * (and any data it carried), both checksums written whole. Anything this
 * cannot rewrite (IP options, a short header) is dropped instead. The
 * trim clears a receive checksum (CHECKSUM_COMPLETE); a SYN from a pod of
 * this node arrives CHECKSUM_PARTIAL, which its own stack trusts when the
 * answer comes back to it (it never leaves the node). */
static __always_inline int ss_answer_reset(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end || ip->ihl != 5)
		return TC_ACT_SHOT;
	__u32 seg = bpf_ntohs(ip->tot_len) - sizeof(*ip) - tcp->doff * 4;
	__u32 ack = bpf_ntohl(tcp->seq) + 1 + seg;
	/* A frame of bare headers would not be trimmed, and trimming is what
	 * drops a receive checksum (CHECKSUM_COMPLETE) the rewrite would
	 * leave stale; no TCP stack sends a SYN without options: dropped. */
	if (skb->len <= sizeof(*eth) + sizeof(*ip) + sizeof(*tcp))
		return TC_ACT_SHOT;
	if (bpf_skb_change_tail(skb, sizeof(*eth) + sizeof(*ip) + sizeof(*tcp), 0))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return TC_ACT_SHOT;

	ss_swap_macs(eth);
	__u32 addr = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = addr;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*tcp));
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = 64;
	ip->check = 0;
	ip->check = ss_csum_fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));

	ss_tcp_to_reset(tcp, ack);
	struct {
		__u32 saddr, daddr;
		__u8 zero, proto;
		__u16 len;
	} pseudo = { .saddr = ip->saddr, .daddr = ip->daddr, .proto = IPPROTO_TCP, .len = bpf_htons(sizeof(*tcp)) };
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	tcp->check = ss_csum_fold(bpf_csum_diff(0, 0, (__be32 *)tcp, sizeof(*tcp), (__u32)sum));
	return bpf_redirect(skb->ifindex, 0);
}

/* ss_tcp_or_verdict's answer when *t holds the packet's TCP headers. */
#define SS_TCP_PARSED 0x7fff

/* The TCP headers of skb in *t: SS_TCP_PARSED; or the verdict on a packet that is not
 * TCP, or TCP whose header cannot be read whole (SS_DROP_FRAGMENT to a
 * pod). Headers that are whole but not all in the linear data are pulled
 * into it and read again. */
static __always_inline int ss_tcp_or_verdict(struct __sk_buff *skb, struct ss_tcp4 *t)
{
	if (!ss_parse_tcp4((void *)(long)skb->data, (void *)(long)skb->data_end, t))
		return SS_TCP_PARSED;
	struct ss_pkt4 p = {};
	int r = ss_parse_pkt4((void *)(long)skb->data, (void *)(long)skb->data_end, &p);
	/* An IPv4 header not in the linear data: pulled in and read again, so
	 * the policy of what is not TCP is not skipped (as tc_egress does). */
	if (r < 0 && !ss_pull_headers(skb))
		r = ss_parse_pkt4((void *)(long)skb->data, (void *)(long)skb->data_end, &p);
	if (r == SS_PARSE_NOT_IP4)
		return ss_tc_not_ip4(skb, 1);
	if (r == 0)
		return ss_tc_flow(skb, &p, 1) ? TC_ACT_OK : TC_ACT_SHOT;
	if (r != SS_PARSE_TCP)
		return TC_ACT_OK; /* an IPv4 header too short to read: the stack drops it */
	if (!p.fragment && !ss_pull_headers(skb) && !ss_parse_tcp4((void *)(long)skb->data, (void *)(long)skb->data_end, t))
		return SS_TCP_PARSED;
	/* TCP whose header is not here whole (a fragment, the first too, or
	 * a truncated header): to a pod the stack would reassemble it past
	 * the capture and the policy, so it is dropped. Linux's TCP never
	 * fragments (DF). */
	struct ss_local *to = bpf_map_lookup_elem(&ss_local_v1, &p.daddr);
	if (!to)
		return TC_ACT_OK;
	ss_count_drop(to->node, SS_DROP_FRAGMENT);
	ss_emit(0, p.saddr, 0, p.daddr, 0, SS_VERDICT_DROPPED, SS_DROP_FRAGMENT, SS_POINT_TC_INGRESS, 0, to->node);
	return TC_ACT_SHOT;
}

SEC("classifier")
int ss_tc_ingress(struct __sk_buff *skb)
{
	/* TCP, most of what comes in, is parsed once; the rest after it. */
	struct ss_tcp4 t;
	int verdict = ss_tcp_or_verdict(skb, &t);
	if (verdict != SS_TCP_PARSED)
		return verdict;
	struct ss_local *local = bpf_map_lookup_elem(&ss_local_v1, &t.daddr);
	if (!local)
		return TC_ACT_OK;
	/* The kubelet's probe (every segment, so a handshake finished under
	 * SYN cookies stays the app's too): only the node can answer to this
	 * source, so no one else completes a connection with it. */
	if (ss_probe_source && t.saddr == ss_probe_source)
		return TC_ACT_OK;
	if (t.syn && !t.ack) {
		struct ss_policy_value *v = t.dport == SS_HBONE_PORT && (local->flags & SS_POD_MESHED)
						    ? ss_policy_all_ports_denied(local->node, t.saddr, t.daddr)
						    : ss_policy_lookup(local->node, t.saddr, t.daddr, t.dport);
		if (v && v->verdict == SS_POLICY_DENY) {
			ss_count_drop(local->node, SS_DROP_POLICY_DENIED);
			ss_emit(0, t.saddr, t.sport, t.daddr, t.dport, SS_VERDICT_DROPPED, SS_DROP_POLICY_DENIED,
				SS_POINT_TC_INGRESS, v->rule, local->node);
			return ss_answer_reset(skb);
		}
	}
	if (t.dport == SS_HBONE_PORT || !(local->flags & SS_POD_MESHED))
		return TC_ACT_OK;

	struct bpf_sock_tuple tuple = {};
	tuple.ipv4.saddr = t.saddr;
	tuple.ipv4.daddr = t.daddr;
	tuple.ipv4.sport = bpf_htons(t.sport);
	tuple.ipv4.dport = bpf_htons(t.dport);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (sk) {
		int listening = sk->state == BPF_TCP_LISTEN;
		bpf_sk_release(sk);
		if (!listening)
			return TC_ACT_OK; /* an existing connection (or handshake) */
	}
	/* No socket, or only the app's listener: every new connection to the
	 * pod is the proxy's (a handshake's last ACK under SYN cookies too). */
	__u32 ip = t.daddr;
	struct bpf_sock *l = bpf_map_lookup_elem(&ss_listeners_v1, &ip);
	if (!l) {
		if (!t.syn || t.ack)
			return TC_ACT_SHOT;
		ss_count_drop(local->node, SS_DROP_NO_PROXY);
		ss_emit(0, t.saddr, t.sport, t.daddr, t.dport, SS_VERDICT_DROPPED, SS_DROP_NO_PROXY, SS_POINT_TC_INGRESS, 0,
			local->node);
		return TC_ACT_SHOT;
	}
	long err = bpf_sk_assign(skb, l, 0);
	bpf_sk_release(l);
	if (err) {
		ss_count_drop(local->node, SS_DROP_NO_PROXY);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}
