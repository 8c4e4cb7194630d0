/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sockops, attached once at the root of the cgroup2 hierarchy: when a
 * connection that
 * connect4.c steered sends its SYN, its local port is known; the original
 * destination moves to ss_origdst_v2 under (network namespace, port), the
 * key the node proxy has in hand when it accepts the connection. The SYN
 * reaches the proxy after this runs, so the entry is always there first.
 * It also gives a steered socket's pending place (connect4.c) back when
 * its handshake ends or fails.
 */
#include "include/ss_lib.h"

SEC("sockops")
int ss_sockops(struct bpf_sock_ops *skops)
{
	/* AF_INET, or AF_INET6 talking IPv4 (an IPv4-mapped peer, steered by
	 * connect6.c). */
	if (skops->family != 2 && skops->family != 10)
		return 1;
	/* A steered connect's handshake is over (established, or closed:
	 * refused, reset, timed out): its pending place goes back, and the
	 * socket's later state changes are no longer reported. Only steered
	 * sockets asked for state changes (below), so every other socket of
	 * the machine passes here with one test. */
	if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || skops->op == BPF_SOCK_OPS_STATE_CB) {
		if (!(skops->bpf_sock_ops_cb_flags & BPF_SOCK_OPS_STATE_CB_FLAG))
			return 1;
		if (skops->op == BPF_SOCK_OPS_STATE_CB && skops->args[1] != BPF_TCP_CLOSE)
			return 1;
		ss_pending_give(bpf_get_socket_cookie(skops));
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_STATE_CB_FLAG);
		return 1;
	}
	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(skops);
	struct ss_steer *od = bpf_map_lookup_elem(&ss_connect_v2, &cookie);
	if (!od)
		return 1;
	struct ss_origdst_key k = { .netns = bpf_get_netns_cookie(skops), .port = (__u16)skops->local_port };
	struct ss_steer v = *od;
	bpf_map_update_elem(&ss_origdst_v2, &k, &v, BPF_ANY);
	bpf_map_delete_elem(&ss_connect_v2, &cookie);
	/* Told when it closes, to give its pending place back. */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	return 1;
}
