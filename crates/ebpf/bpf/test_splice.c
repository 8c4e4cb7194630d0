/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Test only (crates/ebpf/tests/splice.rs): the sockmap/sk_msg splicing of
 * local TCP legs that docs/datapath.md ("Kernel-spliced local legs")
 * weighs, on every loopback connection of one network namespace. sockops
 * puts both ends of an established loopback connection in a sockhash by
 * their 4-tuple; sk_msg sends each message straight into the peer's
 * receive queue (BPF_F_INGRESS) instead of down the loopback TCP path.
 * A socket whose first message could not be spliced (its peer was not in
 * the map yet) stays on TCP for good: a later spliced message would
 * overtake the bytes TCP still carries.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* The network namespace to act in (set at load time). */
volatile const __u64 ss_test_netns = 0;

struct ss_leg {
	__u32 local_ip, remote_ip; /* network order */
	__u32 local_port, remote_port; /* host order */
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 1024);
	__type(key, struct ss_leg);
	__type(value, __u32);
} ss_test_legs SEC(".maps");

/* Sockets that went the TCP way, by their own leg. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct ss_leg);
	__type(value, __u8);
} ss_test_tcp SEC(".maps");

/* [0] messages spliced, [1] messages left to TCP. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} ss_test_counts SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&ss_test_counts, &i);
	if (c)
		__sync_fetch_and_add(c, 1);
}

SEC("sockops")
int ss_test_splice_sockops(struct bpf_sock_ops *s)
{
	if (s->family != 2 || bpf_get_netns_cookie(s) != ss_test_netns)
		return 1;
	if (s->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && s->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if ((bpf_ntohl(s->remote_ip4) >> 24) != 127)
		return 1;
	struct ss_leg k = { .local_ip = s->local_ip4, .remote_ip = s->remote_ip4, .local_port = s->local_port,
			    .remote_port = bpf_ntohl(s->remote_port) };
	bpf_sock_hash_update(s, &ss_test_legs, &k, BPF_ANY);
	return 1;
}

SEC("sk_msg")
int ss_test_splice_msg(struct sk_msg_md *m)
{
	struct ss_leg own = { .local_ip = m->local_ip4, .remote_ip = m->remote_ip4, .local_port = m->local_port,
			      .remote_port = bpf_ntohl(m->remote_port) };
	if (bpf_map_lookup_elem(&ss_test_tcp, &own)) {
		count(1);
		return SK_PASS;
	}
	struct ss_leg peer = { .local_ip = own.remote_ip, .remote_ip = own.local_ip, .local_port = own.remote_port,
			       .remote_port = own.local_port };
	if (bpf_msg_redirect_hash(m, &ss_test_legs, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(0);
		return SK_PASS;
	}
	__u8 one = 1;
	bpf_map_update_elem(&ss_test_tcp, &own, &one, BPF_ANY);
	count(1);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
