/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing for the tc programs: Ethernet, IPv4, TCP. Pure
 * functions of the packet bytes, tested with BPF_PROG_TEST_RUN. */
#ifndef SS_PARSE_H
#define SS_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>

struct ss_tcp4 {
	__u32 saddr; /* network order */
	__u32 daddr;
	__u16 sport; /* host order */
	__u16 dport;
	__u8 syn;
	__u8 ack;
};

/* 0 and *out filled for an IPv4 TCP packet with whole headers in the
 * linear data; -1 for anything else (including IP fragments after the
 * first, which carry no TCP header). */
static __always_inline int ss_parse_tcp4(void *data, void *data_end, struct ss_tcp4 *out)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5 || ip->protocol != IPPROTO_TCP)
		return -1;
	if (ip->frag_off & bpf_htons(0x1fff))
		return -1;
	struct tcphdr *tcp = (void *)ip + ip->ihl * 4;
	if ((void *)(tcp + 1) > data_end)
		return -1;
	out->saddr = ip->saddr;
	out->daddr = ip->daddr;
	out->sport = bpf_ntohs(tcp->source);
	out->dport = bpf_ntohs(tcp->dest);
	out->syn = tcp->syn;
	out->ack = tcp->ack;
	return 0;
}

#endif
