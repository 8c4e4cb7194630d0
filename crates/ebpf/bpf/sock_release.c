/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup/sock_release, at the root of the cgroup2 hierarchy: a socket
 * released while still counted as a pod's pending connect (closed before
 * its handshake said anything, connect() failing before the SYN) gives its
 * place back, so the count never leaks.
 */
#include "include/ss_lib.h"

SEC("cgroup/sock_release")
int ss_sock_release(struct bpf_sock *sk)
{
	ss_pending_give(bpf_get_socket_cookie(sk));
	return 1;
}
