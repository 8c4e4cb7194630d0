/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing for the tc programs: Ethernet, IPv4, TCP, UDP, SCTP,
 * ICMP. Pure functions of the packet bytes, tested with
 * BPF_PROG_TEST_RUN. */
#ifndef SS_PARSE_H
#define SS_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>

/* ICMP's header as far as we read it (<linux/icmp.h> pulls in libc). */
struct ss_icmphdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u16 id;  /* echo and echo reply */
	__u16 seq;
};

#define SS_ICMP_ECHOREPLY 0
#define SS_ICMP_DEST_UNREACH 3
#define SS_ICMP_ECHO 8
#define SS_ICMP_TIME_EXCEEDED 11
#define SS_ICMP_PARAMETERPROB 12

struct ss_tcp4 {
	__u32 saddr; /* network order */
	__u32 daddr;
	__u16 sport; /* host order */
	__u16 dport;
	__u8 syn;
	__u8 ack;
};

/* 0 and *out filled for an IPv4 TCP packet with whole headers in the
 * linear data; -1 for anything else, IP fragments among it: a later one
 * carries no TCP header, and a first one (more-fragments set) would have
 * the stack reassemble a segment of which only this part was looked at
 * (a tiny first fragment, or a later one overlapping the header). */
static __always_inline int ss_parse_tcp4(void *data, void *data_end, struct ss_tcp4 *out)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5 || ip->protocol != IPPROTO_TCP)
		return -1;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF, or an offset */
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

/* Any IPv4 packet that is not TCP, for the flow table and the policy of
 * UDP, SCTP and the rest. */
struct ss_pkt4 {
	__u32 saddr; /* network order */
	__u32 daddr;
	__u16 sport; /* host order; ICMP echo: the identifier */
	__u16 dport; /* host order; 0 for ICMP and the rest */
	__u8 proto;  /* IPPROTO_UDP, IPPROTO_SCTP, IPPROTO_ICMP, other */
	__u8 icmp_type;
	__u8 icmp_error; /* an ICMP error (unreachable, time exceeded, parameter problem) */
	__u8 frag_later; /* a fragment after the first: no ports of its own */
	/* ICMP error: the packet it is about (inner_proto 0: unreadable) */
	__u32 inner_saddr;
	__u32 inner_daddr;
	__u16 inner_sport; /* ICMP echo: the identifier */
	__u16 inner_dport;
	__u8 inner_proto;
	__u8 fragment; /* TCP (SS_PARSE_TCP) only: an IP fragment, the first (more-fragments set) or a later one */
	__u8 pad[2];
};

#define SS_PARSE_NOT_IP4 1
#define SS_PARSE_TCP 2

/* 0 and *out filled for an IPv4 packet that is not TCP; SS_PARSE_TCP for
 * TCP (with out->saddr and out->daddr: the callers drop TCP whose header
 * ss_parse_tcp4 could not read, fragments among it, to their pods),
 * SS_PARSE_NOT_IP4 for what is not IPv4; -1 for an IPv4 packet too short
 * to read (dropped by the callers: the stack would drop it too).
 * Fragments after the first carry no ports: they are read as ports 0. */
static __always_inline int ss_parse_pkt4(void *data, void *data_end, struct ss_pkt4 *out)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return -1;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return SS_PARSE_NOT_IP4;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5)
		return -1;
	out->saddr = ip->saddr;
	out->daddr = ip->daddr;
	out->fragment = (ip->frag_off & bpf_htons(0x3fff)) != 0;
	if (ip->protocol == IPPROTO_TCP)
		return SS_PARSE_TCP;
	out->proto = ip->protocol;
	out->sport = 0;
	out->dport = 0;
	out->icmp_type = 0;
	out->icmp_error = 0;
	out->frag_later = 0;
	out->inner_saddr = 0;
	out->inner_daddr = 0;
	out->inner_sport = 0;
	out->inner_dport = 0;
	out->inner_proto = 0;
	if (ip->frag_off & bpf_htons(0x1fff)) {
		out->frag_later = 1;
		return 0;
	}
	void *l4 = (void *)ip + ip->ihl * 4;
	if (ip->protocol == IPPROTO_UDP || ip->protocol == IPPROTO_SCTP) {
		__u16 *ports = l4;
		if ((void *)(ports + 2) > data_end)
			return -1;
		out->sport = bpf_ntohs(ports[0]);
		out->dport = bpf_ntohs(ports[1]);
	} else if (ip->protocol == IPPROTO_ICMP) {
		struct ss_icmphdr *icmp = l4;
		if ((void *)(icmp + 1) > data_end)
			return -1;
		out->icmp_type = icmp->type;
		if (icmp->type == SS_ICMP_ECHO || icmp->type == SS_ICMP_ECHOREPLY) {
			out->sport = bpf_ntohs(icmp->id);
		} else if (icmp->type == SS_ICMP_DEST_UNREACH || icmp->type == SS_ICMP_TIME_EXCEEDED ||
			   icmp->type == SS_ICMP_PARAMETERPROB) {
			struct iphdr *inner = (void *)(icmp + 1);
			if ((void *)(inner + 1) > data_end)
				return -1;
			out->icmp_error = 1;
			out->inner_saddr = inner->saddr;
			out->inner_daddr = inner->daddr;
			/* The first 8 bytes of the quoted packet's payload: its
			 * ports (or the echo identifier). Options: not read. */
			__u16 *q = (void *)(inner + 1);
			if (inner->ihl == 5 && (void *)(q + 4) <= data_end && !(inner->frag_off & bpf_htons(0x1fff))) {
				if (inner->protocol == IPPROTO_UDP || inner->protocol == IPPROTO_SCTP || inner->protocol == IPPROTO_TCP) {
					out->inner_proto = inner->protocol;
					out->inner_sport = bpf_ntohs(q[0]);
					out->inner_dport = bpf_ntohs(q[1]);
				} else if (inner->protocol == IPPROTO_ICMP) {
					out->inner_proto = IPPROTO_ICMP;
					out->inner_sport = bpf_ntohs(q[2]); /* type, code, checksum, id */
				}
			}
		}
	}
	return 0;
}

#endif
