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
	__u64 cg;
	int verdict;
	struct ss_pod *pod = ss_pod_of_mapped(ctx, &cg, &verdict);
	if (!pod)
		return verdict;
	return ss_udp_egress(cg, pod, ss_sock_port(ctx), ctx->user_ip6[3], bpf_ntohs((__u16)ctx->user_port));
}
