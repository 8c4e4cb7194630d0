/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What a pod's connect() meets, for connect4.c and connect6.c (a
 * dual-stack socket dialing an IPv4-mapped address leaves as IPv4, so the
 * same rules hold for it). `v6` is a constant of each program: the
 * rewrite writes user_ip4 or the IPv4-mapped user_ip6.
 */
#ifndef SS_CONNECT_H
#define SS_CONNECT_H

#include "ss_lib.h"

/* Picks a ready endpoint of the service at dst:port, once, at connect():
 * 1 with *ep set, 0 when dst:port is not a service the maps know (or an
 * index is missing mid-update), -1 when the service has no ready
 * endpoint. */
static __always_inline int ss_pick(__u32 dst, __u16 port, struct ss_origdst *ep)
{
	struct ss_svc_key sk = { .vip = dst, .port = port, .proto = IPPROTO_TCP };
	struct ss_svc *svc = bpf_map_lookup_elem(&ss_services_v1, &sk);
	if (!svc)
		return 0;
	if (svc->count == 0)
		return -1;
	struct ss_backend_key bk = { .vip = dst, .port = port, .index = (__u16)(bpf_get_prandom_u32() % svc->count) };
	struct ss_origdst *b = bpf_map_lookup_elem(&ss_backends_v1, &bk);
	if (!b)
		return 0;
	ep->ip = b->ip;
	ep->port = b->port;
	ep->pad = 0;
	return 1;
}

/* The chosen endpoint's own policy, for a pod outside the mesh (the kernel
 * is its balancer): a source denied there is refused at once. */
static __always_inline int ss_endpoint_denied(__u64 cg, struct ss_pod *pod, struct ss_origdst *ep)
{
	struct ss_policy_value *v = ss_policy_lookup(pod->node, pod->ip, ep->ip, ep->port);
	if (!v || v->verdict != SS_POLICY_DENY)
		return 0;
	ss_count_drop(pod->node, SS_DROP_POLICY_DENIED);
	ss_emit(cg, pod->ip, 0, ep->ip, ep->port, SS_VERDICT_DROPPED, SS_DROP_POLICY_DENIED, SS_POINT_CONNECT, v->rule, pod->node);
	return 1;
}

/* A pod outside the mesh dialing a service: the connection goes to one of
 * its ready endpoints, chosen here, once, with no per-packet NAT; the
 * endpoint's own policy applies; getpeername() still answers the service
 * address (getpeername4.c). Anything else goes on as dialed. */
static __always_inline int ss_balance(struct bpf_sock_addr *ctx, __u64 cg, struct ss_pod *pod, __u32 dst, __u16 port)
{
	struct ss_origdst ep = {};
	int picked = ss_pick(dst, port, &ep);
	if (picked < 0) {
		ss_count_drop(pod->node, SS_DROP_NO_ENDPOINT);
		ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_DROPPED, SS_DROP_NO_ENDPOINT, SS_POINT_CONNECT, 0, pod->node);
		return 0;
	}
	if (picked == 0) {
		ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_FORWARDED, 0, SS_POINT_CONNECT, 0, pod->node);
		return 1;
	}
	if (ss_endpoint_denied(cg, pod, &ep))
		return 0;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct ss_origdst dialed = { .ip = dst, .port = port };
	bpf_map_update_elem(&ss_lbsock_v1, &cookie, &dialed, BPF_ANY);
	ctx->user_ip4 = ep.ip;
	ctx->user_port = bpf_htons(ep.port);
	ss_emit(cg, pod->ip, 0, ep.ip, ep.port, SS_VERDICT_FORWARDED, 0, SS_POINT_CONNECT, 0, pod->node);
	return 1;
}

/* A meshed pod: the connection goes to its node proxy, which learns both
 * the address the app dialed (the service, for telemetry, the forwarded
 * header and waypoints) and, for a service, the endpoint chosen here (one
 * the pod's policy allows; the proxy still decides). A
 * service with no ready endpoint in the maps still goes to the proxy: its
 * view decides (the agent's maps may lag it). */
static __always_inline int ss_steer(struct bpf_sock_addr *ctx, __u64 cg, struct ss_pod *pod, __u32 dst, __u16 port, const int v6)
{
	struct ss_steer st = { .ip = dst, .port = port };
	struct ss_origdst ep = {};
	/* An endpoint the pod may not reach is no choice: the proxy picks
	 * from its own view (the agent's list may lag it) and decides. */
	if (ss_pick(dst, port, &ep) > 0) {
		struct ss_policy_value *v = ss_policy_lookup(pod->node, pod->ip, ep.ip, ep.port);
		if (!v || v->verdict != SS_POLICY_DENY) {
			st.ep_ip = ep.ip;
			st.ep_port = ep.port;
		}
	}
	__u64 cookie = bpf_get_socket_cookie(ctx);
	if (ss_pending_take(cookie, cg)) {
		ss_count_drop(pod->node, SS_DROP_TOO_MANY_PENDING);
		ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_DROPPED, SS_DROP_TOO_MANY_PENDING, SS_POINT_CONNECT, 0, pod->node);
		return 0;
	}
	if (bpf_map_update_elem(&ss_connect_v2, &cookie, &st, BPF_ANY))
		return 0; /* never send a meshed pod's connection around the proxy */
	if (v6) {
		/* ::ffff:127.0.0.1, the proxy's IPv4 listener seen from a
		 * dual-stack socket. */
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = bpf_htonl(0x7f000001);
	} else {
		ctx->user_ip4 = bpf_htonl(0x7f000001);
	}
	ctx->user_port = bpf_htons(SS_OUTBOUND_PORT);
	ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_REDIRECTED, 0, SS_POINT_CONNECT, 0, pod->node);
	return 1;
}

/* A pod's TCP connect() to dst:port (IPv4, network order). */
static __always_inline int ss_on_connect(struct bpf_sock_addr *ctx, __u64 cg, struct ss_pod *pod, __u32 dst, __u16 port,
					 const int v6)
{
	/* Loopback and the pod's own address stay inside the pod. */
	if (ss_is_loopback(dst) || dst == pod->ip || dst == 0)
		return 1;

	struct ss_policy_value *v = ss_policy_lookup(pod->node, pod->ip, dst, port);
	if (v && v->verdict == SS_POLICY_DENY) {
		ss_count_drop(pod->node, SS_DROP_POLICY_DENIED);
		ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_DROPPED, SS_DROP_POLICY_DENIED, SS_POINT_CONNECT, v->rule,
			pod->node);
		return 0;
	}
	if (pod->flags & SS_POD_MESHED)
		return ss_steer(ctx, cg, pod, dst, port, v6);
	/* Outside the mesh: balanced here from IPv4 sockets; a dual-stack
	 * socket's service address is left to the node's service table. */
	return v6 ? 1 : ss_balance(ctx, cg, pod, dst, port);
}

#endif
