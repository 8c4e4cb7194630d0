/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tcx egress of a pod's eth0, in the pod's network namespace: what the
 * pod sends that is not TCP (TCP was decided at connect()). UDP and SCTP
 * to a peer, ICMP and any other protocol: a packet of one of the pod's
 * live flows passes; a new flow the network policies deny (the pod's
 * egress, and the destination's ingress when the kernel knows it) is
 * dropped, counted and recorded; an allowed one is noted in ss_flows_v1
 * so its replies pass the pod's ingress. UDP was already refused at
 * sendmsg()/connect() with EPERM (sendmsg4.c); this holds for what those
 * hooks do not see. IPv6 from a meshed pod is dropped (ss_tc.h). An IPv4
 * packet whose source is not the pod's own address is dropped
 * (SS_DROP_SPOOFED): only a pod with NET_RAW can write one.
 * Pods in and outside the mesh alike.
 */
#include "include/ss_tc.h"

SEC("classifier")
int ss_tc_egress(struct __sk_buff *skb)
{
	struct ss_pkt4 p = {};
	int r = ss_parse_pkt4((void *)(long)skb->data, (void *)(long)skb->data_end, &p);
	/* An IPv4 header not in the linear part (an AF_PACKET TX ring puts
	 * all but the Ethernet header in page fragments): pulled in, then read
	 * again, so neither the source check nor the policy is skipped. */
	if (r < 0 && !ss_pull_headers(skb))
		r = ss_parse_pkt4((void *)(long)skb->data, (void *)(long)skb->data_end, &p);
	/* No IPv4 packet leaves a pod from an address that is not its own: a
	 * pod with NET_RAW could otherwise write any source address, as if
	 * it were another pod or the node (ss_pods_v1: the pod of this
	 * network namespace). */
	if (r == 0 || r == SS_PARSE_TCP) {
		__u64 ns = bpf_get_netns_cookie(skb);
		struct ss_pod *me = bpf_map_lookup_elem(&ss_pods_v1, &ns);
		if (me && p.saddr != me->ip) {
			ss_count_drop(me->node, SS_DROP_SPOOFED);
			__u8 proto = r == SS_PARSE_TCP ? IPPROTO_TCP : p.proto;
			__u16 sport = r == SS_PARSE_TCP ? 0 : p.sport, dport = r == SS_PARSE_TCP ? 0 : p.dport;
			ss_emit_proto(proto, ns, p.saddr, sport, p.daddr, dport, SS_VERDICT_DROPPED, SS_DROP_SPOOFED, SS_POINT_TC_EGRESS, 0,
				      me->node);
			return TC_ACT_SHOT;
		}
	}
	if (r == SS_PARSE_NOT_IP4) {
		/* A pod sends IPv4, IPv6 and ARP. Anything else (a VLAN tag,
		 * 802.1Q or 802.1ad, around IPv4 the other side unwraps) would
		 * carry a packet past the checks above: a pod with NET_RAW
		 * could send from any address. Counted as spoofed. */
		void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
		struct ethhdr *eth = data;
		if ((void *)(eth + 1) <= end && eth->h_proto != bpf_htons(ETH_P_IPV6) && eth->h_proto != bpf_htons(ETH_P_ARP)) {
			__u64 ns = bpf_get_netns_cookie(skb);
			struct ss_pod *me = bpf_map_lookup_elem(&ss_pods_v1, &ns);
			if (me) {
				ss_count_drop(me->node, SS_DROP_SPOOFED);
				return TC_ACT_SHOT;
			}
		}
		return ss_tc_not_ip4(skb, 0);
	}
	if (r == SS_PARSE_TCP)
		return TC_ACT_OK; /* TCP: decided at connect() */
	if (r != 0) {
		/* IPv4 still unreadable once pulled: truncated. Nothing a pod
		 * sends like that is passed unchecked. */
		__u64 ns = bpf_get_netns_cookie(skb);
		return bpf_map_lookup_elem(&ss_pods_v1, &ns) ? TC_ACT_SHOT : TC_ACT_OK;
	}
	return ss_tc_flow(skb, &p, 0) ? TC_ACT_OK : TC_ACT_SHOT;
}
