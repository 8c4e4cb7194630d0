/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/connect4, attached once at the root of the cgroup2 hierarchy: the
 * first thing a TCP connect() meets (and a UDP one: policy only). A socket of a pod's network namespace
 * (ss_pods_v1, by namespace cookie) is the pod's; every other socket goes
 * on untouched. It refuses what the policy maps deny (the app's
 * connect() fails with EPERM at once) and steers a meshed pod's connection
 * to its node proxy's outbound listener (127.0.0.1:15001 in the pod),
 * recording where it was going for the proxy (ss_connect_v2 by socket
 * cookie, moved to ss_origdst_v3 by sockops.c once the port is known);
 * for a service, it also chooses the endpoint (both kinds of pod).
 */
#include "include/ss_connect.h"
SEC("cgroup/connect4")
int ss_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 1 /* SOCK_STREAM */ && ctx->type != 2 /* SOCK_DGRAM */)
		return 1;
	__u64 cg;
	struct ss_pod *pod = ss_pod_of(ctx, &cg);
	if (!pod)
		return 1;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	/* A connected UDP socket: policy only (UDP is not captured). Other
	 * datagram sockets (ICMP echo) are not UDP: left alone. */
	if (ctx->type == 2)
		return ctx->protocol == IPPROTO_UDP ? ss_udp_egress(cg, pod, ss_sock_port(ctx), ctx->user_ip4, port) : 1;
	return ss_on_connect(ctx, cg, pod, ctx->user_ip4, port, 0);
}
