/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/sendmsg4, at the root of the cgroup2 hierarchy: a datagram a pod
 * sends to an address of its choosing (an unconnected UDP socket; a
 * connected one was decided in connect4.c) is refused with EPERM when the
 * network policies deny it. UDP is not captured by the mesh, so a pod's
 * UDP egress policy holds here, meshed or not.
 */
#include "include/ss_lib.h"

SEC("cgroup/sendmsg4")
int ss_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 2 /* SOCK_DGRAM */ || ctx->protocol != IPPROTO_UDP)
		return 1;
	__u64 cg;
	struct ss_pod *pod = ss_pod_of(ctx, &cg);
	if (!pod)
		return 1;
	return ss_udp_egress(cg, pod, ss_sock_port(ctx), ctx->user_ip4, bpf_ntohs((__u16)ctx->user_port));
}
