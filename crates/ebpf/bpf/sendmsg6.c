/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/sendmsg6, at the root of the cgroup2 hierarchy: a pod's datagram
 * from a dual-stack socket to an IPv4-mapped address leaves as IPv4; its
 * UDP egress policy holds as in sendmsg4.c.
 */
#include "include/ss_lib.h"

SEC("cgroup/sendmsg6")
int ss_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 2 /* SOCK_DGRAM */ || ctx->protocol != IPPROTO_UDP)
		return 1;
	if (ctx->user_ip6[0] || ctx->user_ip6[1] || ctx->user_ip6[2] != bpf_htonl(0xffff))
		return ss_ipv6_guard(ctx);
	__u64 cg;
	struct ss_pod *pod = ss_pod_of(ctx, &cg);
	if (!pod)
		return 1;
	return ss_udp_egress(cg, pod, ss_sock_port(ctx), ctx->user_ip6[3], bpf_ntohs((__u16)ctx->user_port));
}
