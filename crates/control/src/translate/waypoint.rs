//! Which waypoint a service or a pod is bound to: Istio's labels, Istio's
//! precedence, and our one difference, failing closed (docs/waypoint.md,
//! "Binding" and "Fail closed, where Istio fails open"). Pure: labels and
//! the known waypoints in, a binding out, for table tests. The index
//! (`crate::index`) fills the workload API's `waypoint` fields from it.

use super::{selector_matches, Labels, USE_WAYPOINT};

/// The GatewayClass whose Gateways are waypoints.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";
/// Names the namespace of the waypoint `istio.io/use-waypoint` names,
/// read from the same object as that label.
pub const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
/// On a waypoint's Gateway: which traffic it takes.
pub const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
/// On the objects a Gateway makes, and on its pods.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The value of `istio.io/use-waypoint` that opts an object out.
pub const NO_WAYPOINT: &str = "none";
/// The waypoint's HBONE port (its Gateway's only listener).
pub const HBONE_LISTENER_PORT: u16 = 15008;

/// `istio.io/waypoint-for`: what a waypoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficType {
    /// Traffic addressed to a service it is bound to (the default).
    Service,
    /// Traffic addressed to a pod it is bound to.
    Workload,
    All,
    None,
}

impl TrafficType {
    /// The label's value (None: unset, so `service`); an unknown value is
    /// an error naming it.
    pub fn parse(v: Option<&str>) -> Result<Self, String> {
        match v {
            None | Some("service") => Ok(TrafficType::Service),
            Some("workload") => Ok(TrafficType::Workload),
            Some("all") => Ok(TrafficType::All),
            Some("none") => Ok(TrafficType::None),
            Some(other) => Err(format!("{WAYPOINT_FOR}: {other:?} is not one of service, workload, all, none")),
        }
    }

    pub fn takes(self, kind: Traffic) -> bool {
        matches!(
            (self, kind),
            (TrafficType::All, _) | (TrafficType::Service, Traffic::Service) | (TrafficType::Workload, Traffic::Workload)
        )
    }
}

/// Which namespaces may bind to a waypoint (its HBONE listener's
/// `allowedRoutes.namespaces.from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedNamespaces {
    /// Its own only (the Gateway API default).
    Same,
    All,
    /// Namespaces whose labels match.
    Selector(Labels),
}

/// A Gateway of class `istio-waypoint`, as binding sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waypoint {
    pub name: String,
    pub namespace: String,
    pub takes: TrafficType,
    pub allowed: AllowedNamespaces,
    /// A pod of it is ready (what makes Istio publish its address).
    pub ready: bool,
}

/// What the binding is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// A Service (traffic addressed to its VIP).
    Service,
    /// A Pod (traffic addressed to its IP).
    Workload,
}

/// Why a binding that was asked for is not in force. Our waypoint fields
/// still name the waypoint in every case (the node proxy then refuses the
/// traffic rather than send it around); Istio leaves them empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotBound {
    /// No Gateway of class `istio-waypoint` by that name.
    NotFound,
    /// It exists, but no pod of it is ready yet.
    NotReady,
    /// It does not take this kind of traffic (`istio.io/waypoint-for`).
    WrongTraffic,
    /// Its listener does not allow the object's namespace.
    NotAllowed,
}

impl NotBound {
    /// The reason of the `istio.io/WaypointBound` condition, as Istio
    /// words it where it has one.
    pub fn reason(&self) -> &'static str {
        match self {
            NotBound::NotFound => "WaypointNotFound",
            NotBound::NotReady => "WaypointIsNotReady",
            NotBound::WrongTraffic => "UnsupportedTrafficType",
            NotBound::NotAllowed => "AttachmentDenied",
        }
    }
}

/// What an object's labels ask for, and the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// No waypoint: none asked for, opted out (`none`), or a pod that
    /// inherited its namespace's waypoint, which does not take workloads
    /// (Istio: no error then, only for the pod's own label).
    None,
    /// Through this waypoint (namespace, name).
    Bound { namespace: String, name: String },
    /// Asked for, not in force: traffic is refused, never sent around.
    Refused { namespace: String, name: String, why: NotBound },
}

/// Resolves `istio.io/use-waypoint` for an object of `namespace` with
/// labels `own`, whose namespace has labels `namespace_labels`, against
/// the known waypoints. `is_waypoint` marks the waypoint's own Service
/// and pods, which never get one (no loop). A waypoint's listener that
/// selects namespaces is matched against `namespace_labels`.
pub fn bind(
    traffic: Traffic,
    namespace: &str,
    own: &Labels,
    namespace_labels: &Labels,
    is_waypoint: bool,
    waypoints: &[Waypoint],
) -> Binding {
    if is_waypoint {
        return Binding::None;
    }
    // The object's own label wins; the namespace-wide one applies
    // otherwise. The waypoint's namespace is read from the same place.
    let (source, inherited) = match own.get(USE_WAYPOINT) {
        Some(_) => (own, false),
        None if namespace_labels.contains_key(USE_WAYPOINT) => (namespace_labels, true),
        None => return Binding::None,
    };
    let name = source[USE_WAYPOINT].as_str();
    if name == NO_WAYPOINT || name.is_empty() {
        return Binding::None;
    }
    let wp_namespace = source.get(USE_WAYPOINT_NAMESPACE).map(String::as_str).filter(|n| !n.is_empty()).unwrap_or(namespace);
    let refused = |why| Binding::Refused { namespace: wp_namespace.into(), name: name.into(), why };
    let Some(w) = waypoints.iter().find(|w| w.name == name && w.namespace == wp_namespace) else {
        // A pod inheriting its namespace's waypoint, which does not exist
        // yet: a waypoint takes services only unless it says otherwise,
        // so the pod has none (its services still fail closed).
        if inherited && traffic == Traffic::Workload {
            return Binding::None;
        }
        return refused(NotBound::NotFound);
    };
    if !w.takes.takes(traffic) {
        // A pod that inherited its namespace's waypoint, which takes
        // services only, simply has none (as Istio does).
        if inherited && traffic == Traffic::Workload {
            return Binding::None;
        }
        return refused(NotBound::WrongTraffic);
    }
    let allowed = match &w.allowed {
        _ if w.namespace == namespace => true,
        AllowedNamespaces::Same => false,
        AllowedNamespaces::All => true,
        AllowedNamespaces::Selector(sel) => selector_matches(sel, namespace_labels),
    };
    if !allowed {
        return refused(NotBound::NotAllowed);
    }
    if !w.ready {
        return refused(NotBound::NotReady);
    }
    Binding::Bound { namespace: w.namespace.clone(), name: w.name.clone() }
}

/// A Gateway's listeners, checked as a waypoint's: exactly one, port
/// 15008, protocol `HBONE`. The error names the field (Istio reports the
/// listener `UnsupportedProtocol`; we refuse it at apply).
pub fn check_listeners(listeners: &[(String, u16, String)]) -> Result<(), (String, String)> {
    match listeners {
        [(_, port, proto)] if *port == HBONE_LISTENER_PORT && proto == "HBONE" => Ok(()),
        [(_, port, proto)] => {
            let field = if *port != HBONE_LISTENER_PORT { "spec.listeners[0].port" } else { "spec.listeners[0].protocol" };
            Err((field.into(), format!("a waypoint has one listener, port 15008, protocol HBONE (found port {port}, protocol {proto})")))
        }
        [] => Err(("spec.listeners".into(), "a waypoint needs one listener, port 15008, protocol HBONE".into())),
        more => {
            Err(("spec.listeners".into(), format!("a waypoint has exactly one listener (port 15008, protocol HBONE), not {}", more.len())))
        }
    }
}

/// A Gateway as the index keeps it: a waypoint (class `istio-waypoint`),
/// validated, or any other Gateway (kept, changes nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayInput {
    Waypoint { takes: TrafficType, allowed: AllowedNamespaces },
    Other,
}

/// Reads a Gateway object (`rest` is everything but metadata). A waypoint
/// must have its one HBONE listener and a known `istio.io/waypoint-for`;
/// every error names the field.
pub fn gateway(o: &crate::objects::OpaqueObject) -> Result<GatewayInput, crate::objects::ObjectError> {
    use crate::objects::{ObjectError, ObjectRef};
    let r = ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or(""));
    let spec = o.rest.get("spec").and_then(|s| s.as_object());
    let class = spec.and_then(|s| s.get("gatewayClassName")).and_then(|c| c.as_str()).unwrap_or("");
    if class != WAYPOINT_CLASS {
        return Ok(GatewayInput::Other);
    }
    let labels = o.metadata.labels.clone().unwrap_or_default();
    let takes = TrafficType::parse(labels.get(WAYPOINT_FOR).map(String::as_str))
        .map_err(|e| ObjectError::new(&r, format!("metadata.labels[{WAYPOINT_FOR}]"), e))?;
    let empty = Vec::new();
    let listeners = spec.and_then(|s| s.get("listeners")).and_then(|l| l.as_array()).unwrap_or(&empty);
    let mut parsed = Vec::new();
    for (i, l) in listeners.iter().enumerate() {
        let name = l.get("name").and_then(|v| v.as_str()).unwrap_or("").to_string();
        let port = l
            .get("port")
            .and_then(|v| v.as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| ObjectError::new(&r, format!("spec.listeners[{i}].port"), "a port number (1-65535) is required"))?;
        let proto = l.get("protocol").and_then(|v| v.as_str()).unwrap_or("").to_string();
        parsed.push((name, port, proto));
    }
    check_listeners(&parsed).map_err(|(field, msg)| ObjectError::new(&r, field, msg))?;
    let from = listeners[0].pointer("/allowedRoutes/namespaces/from").and_then(|v| v.as_str()).unwrap_or("Same");
    let allowed = match from {
        "Same" => AllowedNamespaces::Same,
        "All" => AllowedNamespaces::All,
        "Selector" => {
            let sel = listeners[0].pointer("/allowedRoutes/namespaces/selector");
            if sel.and_then(|s| s.get("matchExpressions")).is_some() {
                return Err(ObjectError::new(
                    &r,
                    "spec.listeners[0].allowedRoutes.namespaces.selector.matchExpressions",
                    "not supported for a waypoint; use matchLabels",
                ));
            }
            let labels: Labels = sel
                .and_then(|s| s.get("matchLabels"))
                .and_then(|m| m.as_object())
                .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
                .unwrap_or_default();
            AllowedNamespaces::Selector(labels)
        }
        other => {
            return Err(ObjectError::new(
                &r,
                "spec.listeners[0].allowedRoutes.namespaces.from",
                format!("{other:?} is not one of Same, All, Selector"),
            ))
        }
    };
    Ok(GatewayInput::Waypoint { takes, allowed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn wp(ns: &str, name: &str, takes: TrafficType, allowed: AllowedNamespaces, ready: bool) -> Waypoint {
        Waypoint { name: name.into(), namespace: ns.into(), takes, allowed, ready }
    }

    fn bound(ns: &str, name: &str) -> Binding {
        Binding::Bound { namespace: ns.into(), name: name.into() }
    }

    fn refused(ns: &str, name: &str, why: NotBound) -> Binding {
        Binding::Refused { namespace: ns.into(), name: name.into(), why }
    }

    // a table of label combinations, one case each.
    #[allow(clippy::too_many_lines)]
    #[test]
    fn istios_labels_and_precedence_and_we_fail_closed() {
        use AllowedNamespaces::*;
        use Traffic::{Service as Svc, Workload as Wl};
        use TrafficType as T;
        let waypoints = vec![
            wp("bookinfo", "waypoint", T::Service, Same, true),
            wp("bookinfo", "all", T::All, Same, true),
            wp("bookinfo", "pods", T::Workload, Same, true),
            wp("bookinfo", "starting", T::Service, Same, false),
            wp("shared", "open", T::Service, All, true),
            wp("shared", "picky", T::Service, Selector(labels(&[("team", "a")])), true),
            wp("shared", "closed", T::Service, Same, true),
        ];
        let ns_wp = labels(&[(USE_WAYPOINT, "waypoint")]);
        let none = Labels::new();
        let cases: Vec<(&str, Traffic, &str, Labels, Labels, bool, Binding)> = vec![
            ("no label anywhere", Svc, "bookinfo", none.clone(), none.clone(), false, Binding::None),
            ("the namespace's label", Svc, "bookinfo", none.clone(), ns_wp.clone(), false, bound("bookinfo", "waypoint")),
            ("the object's label wins", Svc, "bookinfo", labels(&[(USE_WAYPOINT, "all")]), ns_wp.clone(), false, bound("bookinfo", "all")),
            ("`none` opts out", Svc, "bookinfo", labels(&[(USE_WAYPOINT, "none")]), ns_wp.clone(), false, Binding::None),
            ("the waypoint's own service", Svc, "bookinfo", none.clone(), ns_wp.clone(), true, Binding::None),
            (
                "a pod inheriting a missing waypoint has none",
                Wl,
                "bookinfo",
                none.clone(),
                labels(&[(USE_WAYPOINT, "gone")]),
                false,
                Binding::None,
            ),
            (
                "a pod's own label naming a missing waypoint: refused",
                Wl,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "gone")]),
                none.clone(),
                false,
                refused("bookinfo", "gone", NotBound::NotFound),
            ),
            (
                "missing: refused, not skipped",
                Svc,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "gone")]),
                none.clone(),
                false,
                refused("bookinfo", "gone", NotBound::NotFound),
            ),
            (
                "not ready: refused",
                Svc,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "starting")]),
                none.clone(),
                false,
                refused("bookinfo", "starting", NotBound::NotReady),
            ),
            ("a pod under a service waypoint (inherited): none", Wl, "bookinfo", none.clone(), ns_wp.clone(), false, Binding::None),
            (
                "a pod naming a service waypoint itself: refused",
                Wl,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "waypoint")]),
                none.clone(),
                false,
                refused("bookinfo", "waypoint", NotBound::WrongTraffic),
            ),
            (
                "a pod under a workload waypoint",
                Wl,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "pods")]),
                none.clone(),
                false,
                bound("bookinfo", "pods"),
            ),
            (
                "a service naming a workload waypoint: refused",
                Svc,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "pods")]),
                none.clone(),
                false,
                refused("bookinfo", "pods", NotBound::WrongTraffic),
            ),
            ("a pod under `all`", Wl, "bookinfo", labels(&[(USE_WAYPOINT, "all")]), none.clone(), false, bound("bookinfo", "all")),
            (
                "another namespace's, allowed from all",
                Svc,
                "reviews",
                labels(&[(USE_WAYPOINT, "open"), (USE_WAYPOINT_NAMESPACE, "shared")]),
                none.clone(),
                false,
                bound("shared", "open"),
            ),
            (
                "another namespace's, from its own only",
                Svc,
                "reviews",
                labels(&[(USE_WAYPOINT, "closed"), (USE_WAYPOINT_NAMESPACE, "shared")]),
                none.clone(),
                false,
                refused("shared", "closed", NotBound::NotAllowed),
            ),
            (
                "another namespace's, by selector, matching",
                Svc,
                "reviews",
                labels(&[(USE_WAYPOINT, "picky"), (USE_WAYPOINT_NAMESPACE, "shared")]),
                labels(&[("team", "a")]),
                false,
                bound("shared", "picky"),
            ),
            (
                "the namespace names another namespace's waypoint for its objects",
                Svc,
                "reviews",
                none.clone(),
                labels(&[(USE_WAYPOINT, "open"), (USE_WAYPOINT_NAMESPACE, "shared")]),
                false,
                bound("shared", "open"),
            ),
            (
                "use-waypoint-namespace is read where use-waypoint is (the object's label, its own namespace)",
                Svc,
                "bookinfo",
                labels(&[(USE_WAYPOINT, "waypoint")]),
                labels(&[(USE_WAYPOINT, "open"), (USE_WAYPOINT_NAMESPACE, "shared")]),
                false,
                bound("bookinfo", "waypoint"),
            ),
        ];
        for (why, traffic, ns, own, ns_labels, is_waypoint, want) in cases {
            assert_eq!(bind(traffic, ns, &own, &ns_labels, is_waypoint, &waypoints), want, "{why}");
        }
    }

    #[test]
    fn waypoint_for_and_listeners_are_checked_with_the_field_named() {
        assert_eq!(TrafficType::parse(None), Ok(TrafficType::Service));
        assert_eq!(TrafficType::parse(Some("all")), Ok(TrafficType::All));
        assert!(TrafficType::parse(Some("pods")).unwrap_err().contains("\"pods\" is not one of service, workload, all, none"));
        assert_eq!(check_listeners(&[("mesh".into(), 15008, "HBONE".into())]), Ok(()));
        assert_eq!(check_listeners(&[("mesh".into(), 15008, "HTTP".into())]).unwrap_err().0, "spec.listeners[0].protocol");
        assert_eq!(check_listeners(&[("mesh".into(), 80, "HBONE".into())]).unwrap_err().0, "spec.listeners[0].port");
        assert_eq!(check_listeners(&[]).unwrap_err().0, "spec.listeners");
        let two = [("a".into(), 15008, "HBONE".into()), ("b".into(), 15009, "HBONE".into())];
        assert!(check_listeners(&two).unwrap_err().1.contains("exactly one listener"));
        assert_eq!(NotBound::NotReady.reason(), "WaypointIsNotReady");
    }
}
