/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/getpeername4, attached with connect4.c: a socket that connect4.c
 * balanced to a service endpoint answers getpeername() with the service
 * address and port the app dialed, as it would behind per-packet NAT.
 */
#include "include/ss_lib.h"

SEC("cgroup/getpeername4")
int ss_getpeername4(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct ss_origdst *d = bpf_map_lookup_elem(&ss_lbsock_v1, &cookie);
	if (d) {
		ctx->user_ip4 = d->ip;
		ctx->user_port = bpf_htons(d->port);
	}
	return 1;
}
