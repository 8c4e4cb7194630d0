/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sockops, attached once at the root of the cgroup2 hierarchy: when a
 * connection that
 * connect4.c steered sends its SYN, its local address and port are known;
 * the original destination moves to ss_origdst_v3 under (network
 * namespace, address, port), the key the node proxy has in hand when it
 * accepts the connection (its peer), with the socket's cookie. The SYN
 * reaches the proxy after this runs, so the entry is always there first.
 * It also gives a steered socket's pending place (connect4.c) back when
 * its handshake ends or fails, and removes its entry when it closes
 * without the proxy having taken it (a SYN never accepted), so a later
 * socket on the same address and port never finds it.
 */
#include "include/ss_lib.h"

/* The socket's own IPv4 address: AF_INET's, or the IPv4 address an
 * AF_INET6 socket talking IPv4 has mapped (::ffff:a.b.c.d). */
static __always_inline __u32 ss_sock_ip4(struct bpf_sock_ops *skops)
{
	/* Both read at their fixed offsets (the verifier refuses a context
	 * offset chosen at run time), then one kept. */
	__u32 v4 = *(volatile __u32 *)&skops->local_ip4;
	__u32 v6 = *(volatile __u32 *)&skops->local_ip6[3];
	return skops->family == 2 ? v4 : v6;
}

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
	if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
		/* Established: the pending place goes back; the state is still
		 * watched for the close. Every active connection of the machine
		 * passes here: one test for those not steered. */
		if (skops->bpf_sock_ops_cb_flags & BPF_SOCK_OPS_STATE_CB_FLAG)
			ss_pending_give(bpf_get_socket_cookie(skops));
		return 1;
	}
	if (skops->op == BPF_SOCK_OPS_STATE_CB) {
		/* Only sockets someone asked state changes for get here. (The
		 * flag is not tested, nor cleared: another datapath attached
		 * beside this one, during an upgrade, may have cleared it.) */
		if (skops->args[1] != BPF_TCP_CLOSE)
			return 1;
		__u64 cookie = bpf_get_socket_cookie(skops);
		ss_pending_give(cookie);
		/* Closed: its original destination goes too, unless the proxy
		 * took it (then nothing is there) or another socket's is there. */
		struct ss_origdst_key k = { .netns = bpf_get_netns_cookie(skops), .ip = ss_sock_ip4(skops), .port = (__u16)skops->local_port };
		struct ss_origdst_entry *e = bpf_map_lookup_elem(&ss_origdst_v3, &k);
		if (e && e->cookie == cookie)
			bpf_map_delete_elem(&ss_origdst_v3, &k);
		return 1;
	}
	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(skops);
	struct ss_steer *od = bpf_map_lookup_elem(&ss_connect_v2, &cookie);
	if (!od)
		return 1;
	struct ss_origdst_key k = { .netns = bpf_get_netns_cookie(skops), .ip = ss_sock_ip4(skops), .port = (__u16)skops->local_port };
	struct ss_origdst_entry v = { .steer = *od, .cookie = cookie };
	bpf_map_update_elem(&ss_origdst_v3, &k, &v, BPF_ANY);
	bpf_map_delete_elem(&ss_connect_v2, &cookie);
	/* Told when its handshake ends (to give its pending place back) and
	 * when it closes (to remove its entry if the proxy never took it). */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	return 1;
}
