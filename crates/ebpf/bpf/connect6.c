/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/connect6, at the root of the cgroup2 hierarchy: a pod's
 * dual-stack (AF_INET6) socket dialing an IPv4-mapped address
 * (::ffff:a.b.c.d, what Java and getaddrinfo's AI_V4MAPPED use) talks IPv4
 * on the wire but never meets connect4: the same decision applies here,
 * or such a socket would go around the proxy and the policy. Real IPv6 is
 * refused for a meshed pod with EPERM (ss_ipv6_guard), and its
 * packets on the pod's eth0 by the tc programs.
 */
#include "include/ss_connect.h"

SEC("cgroup/connect6")
int ss_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 1 /* SOCK_STREAM */ && ctx->type != 2 /* SOCK_DGRAM */)
		return 1;
	__u64 cg;
	int verdict;
	struct ss_pod *pod = ss_pod_of_mapped(ctx, &cg, &verdict);
	if (!pod)
		return verdict;
	__u32 dst = ctx->user_ip6[3];
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	if (ctx->type == 2)
		return ctx->protocol == IPPROTO_UDP ? ss_udp_egress(cg, pod, ss_sock_port(ctx), dst, port) : 1;
	return ss_on_connect(ctx, cg, pod, dst, port, 1);
}
