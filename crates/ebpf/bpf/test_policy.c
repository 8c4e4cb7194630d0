/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Test only (BPF_PROG_TEST_RUN): the policy lookup connect4.c makes, on the
 * addresses and port of a packet, since cgroup connect hooks cannot be
 * test-run. Returns the verdict found (0: the kernel has no say).
 */
#include "include/ss_lib.h"
#include "include/ss_parse.h"

SEC("classifier")
int ss_test_policy(struct __sk_buff *skb)
{
	struct ss_tcp4 t;
	if (ss_parse_tcp4((void *)(long)skb->data, (void *)(long)skb->data_end, &t))
		return 255;
	/* The node is the packet's mark (0 without one). */
	__u16 node = (__u16)skb->mark;
	if (t.dport == SS_HBONE_PORT) {
		struct ss_policy_value *all = ss_policy_all_ports_denied(node, t.saddr, t.daddr);
		return all ? all->verdict : 0;
	}
	struct ss_policy_value *v = ss_policy_lookup(node, t.saddr, t.daddr, t.dport);
	return v ? v->verdict : 0;
}
