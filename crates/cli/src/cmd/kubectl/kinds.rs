//! The kinds kubectl's verbs know, by any of kubectl's names for them.

/// A kind as kubectl names it: its aliases, its name in `-o name` output
/// and whether it lives in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub kind: &'static str,
    /// `-o name` and message prefix: `pod`, `deployment.apps`, `gateway.gateway.networking.k8s.io`.
    pub resource: &'static str,
    /// kubectl's plural, in `pods "x" not found`.
    pub plural: &'static str,
    pub namespaced: bool,
    aliases: &'static [&'static str],
}

/// Every kind the verbs take.
const KINDS: &[Kind] = &[
    Kind { kind: "Pod", resource: "pod", plural: "pods", namespaced: true, aliases: &["po", "pod", "pods"] },
    Kind { kind: "Service", resource: "service", plural: "services", namespaced: true, aliases: &["svc", "service", "services"] },
    Kind {
        kind: "Deployment",
        resource: "deployment.apps",
        plural: "deployments.apps",
        namespaced: true,
        aliases: &["deploy", "deployment", "deployments"],
    },
    Kind { kind: "Namespace", resource: "namespace", plural: "namespaces", namespaced: false, aliases: &["ns", "namespace", "namespaces"] },
    Kind {
        kind: "ServiceAccount",
        resource: "serviceaccount",
        plural: "serviceaccounts",
        namespaced: true,
        aliases: &["sa", "serviceaccount", "serviceaccounts"],
    },
    Kind { kind: "ConfigMap", resource: "configmap", plural: "configmaps", namespaced: true, aliases: &["cm", "configmap", "configmaps"] },
    Kind {
        kind: "Gateway",
        resource: "gateway.gateway.networking.k8s.io",
        plural: "gateways.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["gtw", "gateway", "gateways"],
    },
    Kind {
        kind: "HTTPRoute",
        resource: "httproute.gateway.networking.k8s.io",
        plural: "httproutes.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["httproute", "httproutes"],
    },
    Kind {
        kind: "GRPCRoute",
        resource: "grpcroute.gateway.networking.k8s.io",
        plural: "grpcroutes.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["grpcroute", "grpcroutes"],
    },
    Kind {
        kind: "AuthorizationPolicy",
        resource: "authorizationpolicy.security.istio.io",
        plural: "authorizationpolicies.security.istio.io",
        namespaced: true,
        aliases: &["ap", "authorizationpolicy", "authorizationpolicies"],
    },
    Kind {
        kind: "PeerAuthentication",
        resource: "peerauthentication.security.istio.io",
        plural: "peerauthentications.security.istio.io",
        namespaced: true,
        aliases: &["pa", "peerauthentication", "peerauthentications"],
    },
    Kind {
        kind: "RequestAuthentication",
        resource: "requestauthentication.security.istio.io",
        plural: "requestauthentications.security.istio.io",
        namespaced: true,
        aliases: &["ra", "requestauthentication", "requestauthentications"],
    },
    Kind {
        kind: "VirtualService",
        resource: "virtualservice.networking.istio.io",
        plural: "virtualservices.networking.istio.io",
        namespaced: true,
        aliases: &["vs", "virtualservice", "virtualservices"],
    },
    Kind {
        kind: "DestinationRule",
        resource: "destinationrule.networking.istio.io",
        plural: "destinationrules.networking.istio.io",
        namespaced: true,
        aliases: &["dr", "destinationrule", "destinationrules"],
    },
    Kind {
        kind: "NetworkPolicy",
        resource: "networkpolicy.networking.k8s.io",
        plural: "networkpolicies.networking.k8s.io",
        namespaced: true,
        aliases: &["netpol", "networkpolicy", "networkpolicies"],
    },
    Kind {
        kind: "CiliumNetworkPolicy",
        resource: "ciliumnetworkpolicy.cilium.io",
        plural: "ciliumnetworkpolicies.cilium.io",
        namespaced: true,
        aliases: &["cnp", "ciliumnetworkpolicy", "ciliumnetworkpolicies"],
    },
    Kind {
        kind: "LocalRateLimitPolicy",
        resource: "localratelimitpolicy.slipstream.io",
        plural: "localratelimitpolicies.slipstream.io",
        namespaced: true,
        aliases: &["localratelimitpolicy", "localratelimitpolicies"],
    },
];

/// A kind by any of kubectl's names for it (`po`, `pods`, `deployments.apps`,
/// `gateway.gateway.networking.k8s.io`, `Gateway`).
pub fn kind(name: &str) -> Result<Kind, String> {
    let lower = name.to_ascii_lowercase();
    let short = lower.split('.').next().unwrap_or(&lower);
    KINDS
        .iter()
        .find(|k| {
            k.aliases.contains(&lower.as_str())
                || k.kind.eq_ignore_ascii_case(&lower)
                || lower == k.resource
                || lower == k.plural
                || (lower.contains('.') && k.aliases.contains(&short) && (k.resource.ends_with(&lower[short.len()..])))
        })
        .copied()
        .ok_or_else(|| format!("the server doesn't have a resource type \"{name}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_any_name() {
        for (name, want) in [
            ("po", "Pod"),
            ("pods", "Pod"),
            ("svc", "Service"),
            ("deploy", "Deployment"),
            ("deployments.apps", "Deployment"),
            ("ns", "Namespace"),
            ("gateway.gateway.networking.k8s.io", "Gateway"),
            ("gtw", "Gateway"),
            ("authorizationpolicies", "AuthorizationPolicy"),
            ("AuthorizationPolicy", "AuthorizationPolicy"),
            ("vs", "VirtualService"),
            ("cnp", "CiliumNetworkPolicy"),
        ] {
            assert_eq!(kind(name).map(|k| k.kind), Ok(want), "{name}");
        }
        assert_eq!(kind("widgets").unwrap_err(), "the server doesn't have a resource type \"widgets\"");
    }
}
