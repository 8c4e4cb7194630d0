//! What the endpoint a request (or TCP connection) is about to be sent to
//! allows, asked by the forwarding loop for each attempt's endpoint (and
//! by the TCP path and mirrors): its own policies with the original
//! client, and the source's egress network policies on it.

use crate::{peer, plan, Shared};
use slipstream_core::MeshState;
use std::sync::Arc;

impl Shared {
    /// The endpoint's own decision on a request (or, `req` None, a TCP
    /// connection) the waypoint is about to send it, taken here with the
    /// original client as the endpoint's node proxy would take it had the
    /// client come directly (that node proxy sees the waypoint's identity
    /// and lets it through: docs/waypoint.md, "Policy"): its ingress
    /// network policies with the client's address, then its
    /// AuthorizationPolicies, at L7 where the control plane gave their L7
    /// versions for it, else by the node proxies' engine on the same
    /// resources they receive. Err names the deciding policy, when one did.
    pub(crate) fn authorize_endpoint(
        &self,
        state: &MeshState,
        w: &slipstream_core::MeshWorkload,
        ep: std::net::SocketAddr,
        caller: plan::Caller,
        req: Option<(&slipstream_core::route::RequestView, &str)>,
        request_id: &str,
    ) -> Result<(), Option<String>> {
        use slipstream_core::engine;
        use slipstream_core::policy::network::{Direction, L4Protocol};
        let name = |b: &slipstream_core::policy::PolicyRule| format!("{}/{}", b.namespace, b.name);
        let conn = engine::Connection {
            protocol: L4Protocol::Tcp,
            src_ip: caller.addr,
            peer: Some(caller.identity),
            dst_ip: ep.ip(),
            dst_port: ep.port(),
        };
        let network = engine::network(state, w, Direction::Ingress, &conn);
        if !network.allowed {
            return Err(network.by.as_ref().or(network.candidates.first()).map(name));
        }
        let all = self.workload_policies.load();
        if let Some(policies) = all.get(&w.uid) {
            let Some(v) = plan::authorize_endpoint(policies, ep.port(), caller, req) else { return Ok(()) };
            for d in &v.dry_run_denials {
                tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, policy = %format!("{}/{}", d.namespace, d.name), request_id, "dry-run: would be denied");
            }
            return if v.allowed { Ok(()) } else { Err(v.by.map(|b| format!("{}/{}", b.namespace, b.name))) };
        }
        let mut dry_run = Vec::new();
        let istio = engine::istio(state, w, &conn, &mut dry_run);
        for d in &dry_run {
            tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, policy = %name(d), request_id, "dry-run: would be denied");
        }
        if istio.allowed {
            Ok(())
        } else {
            Err(istio.by.as_ref().or(istio.candidates.first()).map(name))
        }
    }

    /// The source's egress network policies on the endpoint `ep`: its node
    /// proxy could not apply them (it did not know the endpoint). The
    /// source is the workload at the tunnel's address with the verified
    /// identity (node proxies open tunnels from the pod's address). When
    /// there is none (the waypoint has not heard of the pod yet, or the
    /// address is another's), its egress policies cannot be known: refused
    /// if any network policy of its namespace restricts egress (fail
    /// closed), as they may select it.
    pub(crate) fn source_egress(
        &self,
        state: &MeshState,
        peer: &peer::Peer,
        ep: std::net::SocketAddr,
    ) -> Result<(), Arc<slipstream_proxy::denial::Denial>> {
        match state.workload_by_ip(peer.addr.ip()).filter(|w| w.identity() == &peer.identity) {
            Some(src) => slipstream_proxy::authz::outbound(state, &src, peer.addr, ep),
            None => {
                let ns = peer.identity.namespace();
                let restricting = state.net_policies().find(|p| p.namespace == ns && (p.isolates_egress || !p.egress_deny.is_empty()));
                match restricting {
                    None => Ok(()),
                    Some(p) => Err(Arc::new(slipstream_proxy::denial::Denial {
                        text: format!(
                            "network policy: {} is no workload of identity {} known here, and {:?} {}/{} restricts the egress of its namespace: \
                             its egress policies cannot be decided",
                            peer.addr.ip(),
                            peer.identity,
                            p.kind,
                            p.namespace,
                            p.name
                        )
                        .into(),
                        layer: "network_policy",
                        by: None,
                    })),
                }
            }
        }
    }
}
