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
 * hooks do not see. IPv6 from a meshed pod is dropped (ss_tc.h).
 * Pods in and outside the mesh alike.
 */
#include "include/ss_tc.h"

SEC("classifier")
int ss_tc_egress(struct __sk_buff *skb)
{
	struct ss_pkt4 p;
	int r = ss_parse_pkt4((void *)(long)skb->data, (void *)(long)skb->data_end, &p);
	if (r == SS_PARSE_NOT_IP4)
		return ss_tc_not_ip4(skb, 0);
	if (r != 0)
		return TC_ACT_OK; /* TCP: decided at connect(); or unreadable, which the stack drops */
	return ss_tc_flow(skb, &p, 0) ? TC_ACT_OK : TC_ACT_SHOT;
}
