/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/connect4, attached once at the root of the cgroup2 hierarchy: the
 * first thing a TCP connect() meets (and a UDP one: policy only). A socket of a pod's network namespace
 * (ss_pods_v1, by namespace cookie) is the pod's; every other socket goes
 * on untouched. It refuses what the policy maps deny (the app's
 * connect() fails with EPERM at once) and steers a meshed pod's connection
 * to its node proxy's outbound listener (127.0.0.1:15001 in the pod),
 * recording where it was going for the proxy (ss_connect_v2 by socket
 * cookie, moved to ss_origdst_v2 by sockops.c once the port is known);
 * for a service, it also chooses the endpoint (both kinds of pod).
 */
#include "include/ss_lib.h"

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
static __always_inline int ss_steer(struct bpf_sock_addr *ctx, __u64 cg, struct ss_pod *pod, __u32 dst, __u16 port)
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
	ctx->user_ip4 = bpf_htonl(0x7f000001);
	ctx->user_port = bpf_htons(SS_OUTBOUND_PORT);
	ss_emit(cg, pod->ip, 0, dst, port, SS_VERDICT_REDIRECTED, 0, SS_POINT_CONNECT, 0, pod->node);
	return 1;
}

SEC("cgroup/connect4")
int ss_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 1 /* SOCK_STREAM */ && ctx->type != 2 /* SOCK_DGRAM */)
		return 1;
	__u64 cg;
	struct ss_pod *pod = ss_pod_of(ctx, &cg);
	if (!pod)
		return 1;
	/* A connected UDP socket: policy only (UDP is not captured). Other
	 * datagram sockets (ICMP echo) are not UDP: left alone. */
	if (ctx->type == 2)
		return ctx->protocol == IPPROTO_UDP ? ss_udp_egress(cg, pod, ctx->user_ip4, bpf_ntohs((__u16)ctx->user_port)) : 1;
	__u32 dst = ctx->user_ip4;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
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
	if (!(pod->flags & SS_POD_MESHED))
		return ss_balance(ctx, cg, pod, dst, port);
	return ss_steer(ctx, cg, pod, dst, port);
}
