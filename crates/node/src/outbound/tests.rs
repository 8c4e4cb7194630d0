//! `plan` as a table: every routing case, no sockets.

use super::*;
use slipstream_core::*;
use std::collections::BTreeMap;
use std::net::IpAddr;

fn size_of_future<A, B, C, D, F>(_: fn(A, B, C, D) -> F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn the_future_of_an_open_connection_stays_small() {
    // 10k open connections hold 10k of these (an async fn was 1040 bytes;
    // 480 before the record owned the connection's cancellation handle,
    // its byte counts and its outcome; 552 with the pod's share of the
    // buffer budget and the stream's chunks in flight).
    let size = size_of_future(handle);
    println!("outbound handle: {size} bytes");
    assert!(size <= 552, "{size} bytes");
}

const SVC: &str = "default/echo.default.svc.cluster.local";
const OWN: &str = "10.244.1.5";

fn wl(name: &str, ip: &str, meshed: bool, sa: &str, cap: u32, target: Option<u16>, healthy: bool) -> Workload {
    let mut services = BTreeMap::new();
    if let Some(t) = target {
        services.insert(SVC.to_string(), vec![Port { service_port: 80, target_port: t, app_protocol: Default::default() }]);
    }
    Workload {
        uid: format!("c//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip.parse().unwrap()],
        tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
        service_account: sa.into(),
        capacity: cap,
        services,
        status: if healthy { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy },
        ..Default::default()
    }
}

fn svc(name: &str, vip: &str, sans: &[&str]) -> Service {
    Service {
        name: name.into(),
        namespace: "default".into(),
        hostname: format!("{name}.default.svc.cluster.local"),
        addresses: vec![NetworkAddress { network: String::new(), address: vip.parse().unwrap() }],
        ports: vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
        subject_alt_names: sans.iter().map(|s| s.to_string()).collect(),
        waypoint: None,
    }
}

/// The mesh of every row: a meshed echo service with two endpoints of
/// weights 1 and 3 (one more unhealthy), an unmeshed service, a service
/// with no healthy endpoint, a plain pod, and the source pod itself.
fn state() -> Arc<MeshState> {
    let cfg = MeshConfig {
        workloads: vec![
            wl("client", OWN, true, "client", 1, None, true),
            wl("echo-a", "10.244.2.2", true, "echo", 1, Some(8080), true),
            wl("echo-b", "10.244.2.3", true, "echo", 3, Some(8081), true),
            wl("echo-sick", "10.244.2.4", true, "echo", 9, Some(8080), false),
            wl("plain", "10.244.2.9", false, "", 1, None, true),
        ],
        services: vec![
            svc("echo", "10.96.0.10", &["spiffe://cluster.local/ns/default/sa/extra"]),
            svc("legacy", "10.96.0.11", &[]),
            svc("empty", "10.96.0.12", &[]),
        ],
        policies: vec![],
        net_policies: vec![],
    };
    let mut cfg = cfg;
    // legacy's only endpoint is the unmeshed pod.
    cfg.workloads[4].services.insert(
        "default/legacy.default.svc.cluster.local".into(),
        vec![Port { service_port: 80, target_port: 9090, app_protocol: Default::default() }],
    );
    let (s, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    s
}

/// What a row expects.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    /// HBONE: dst.addr (`<ip>:15008`), authority, expected identities (service accounts), service host.
    Hbone(&'static str, &'static str, Vec<&'static str>, Option<&'static str>),
    /// Passthrough to this address, naming this workload (or none).
    Pass(&'static str, Option<&'static str>),
    /// Refused with this flag.
    Refused(&'static str),
}

fn run(state: &MeshState, src: Option<&str>, dst: &str, draw: u64) -> Want {
    run_chosen(state, src, dst, None, draw)
}

fn run_chosen(state: &MeshState, src: Option<&str>, dst: &str, chosen: Option<&str>, draw: u64) -> Want {
    let src_w = src.and_then(|ip| state.workload_by_ip(ip.parse().unwrap()));
    let src_addr = SocketAddr::new(src.unwrap_or(OWN).parse().unwrap(), 40000);
    let chosen = chosen.map(|c| c.parse().unwrap());
    let req =
        Request { src: src_w, src_addr, pod_ip: OWN.parse().unwrap(), dst: dst.parse().unwrap(), chosen, draw, loopback_is_local: true };
    match plan(state, &req) {
        Err(e) => Want::Refused(e.flag().as_str()),
        Ok(Plan { route: Route::Passthrough { addr }, info }) => {
            assert!(!info.mutual_tls && info.hbone_addr.is_none() && info.src_identity().is_none(), "{info:?}");
            assert_eq!(info.dst_addr, addr, "dst.addr is where the proxy connects");
            let leaked: &'static str = Box::leak(addr.to_string().into_boxed_str());
            Want::Pass(leaked, info.dst.as_ref().map(|w| &*Box::leak(w.name.clone().into_boxed_str())))
        }
        Ok(Plan { route: Route::Hbone { key, authority, service_host }, info }) => {
            assert!(info.mutual_tls);
            assert_eq!(Some(authority), info.hbone_addr, "dst.hbone_addr is the tunnelled target");
            assert_eq!(info.dst_addr, key.dst(), "dst.addr is the tunnel's <ip>:15008");
            assert_eq!(key.src_ip(), src_addr.ip(), "tunnels are pooled per source IP");
            assert_eq!(key.src_identity().to_string(), "spiffe://cluster.local/ns/default/sa/client");
            assert_eq!(info.src_identity(), Some(key.src_identity()), "the source identity travels in the plan");
            let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
            let ids = key.dst_identities().iter().map(|i| leak(i.service_account().to_string())).collect();
            Want::Hbone(leak(key.dst().to_string()), leak(authority.to_string()), ids, service_host.map(|h| leak(h.to_string())))
        }
    }
}

#[test]
fn plans_as_a_table() {
    let s = state();
    let me = Some(OWN);
    let echo_host = Some("echo.default.svc.cluster.local");
    // (source, destination, draw, expected)
    let rows: Vec<(Option<&str>, &str, u64, Want)> = vec![
        // A service VIP: a healthy meshed endpoint chosen by weight (1:3),
        // its own target port, and the service's SANs expected too.
        (me, "10.96.0.10:80", 0, Want::Hbone("10.244.2.2:15008", "10.244.2.2:8080", vec!["echo", "extra"], echo_host)),
        (me, "10.96.0.10:80", 1, Want::Hbone("10.244.2.3:15008", "10.244.2.3:8081", vec!["echo", "extra"], echo_host)),
        (me, "10.96.0.10:80", 2, Want::Hbone("10.244.2.3:15008", "10.244.2.3:8081", vec!["echo", "extra"], echo_host)),
        (me, "10.96.0.10:80", 3, Want::Hbone("10.244.2.3:15008", "10.244.2.3:8081", vec!["echo", "extra"], echo_host)),
        (me, "10.96.0.10:80", 4, Want::Hbone("10.244.2.2:15008", "10.244.2.2:8080", vec!["echo", "extra"], echo_host)),
        // A port the service does not have; a service without healthy endpoints.
        (me, "10.96.0.10:81", 0, Want::Refused("CONNECT")),
        (me, "10.96.0.12:80", 0, Want::Refused("CONNECT")),
        // A service whose endpoint is outside the mesh: plaintext, mapped port.
        (me, "10.96.0.11:80", 0, Want::Pass("10.244.2.9:9090", Some("plain"))),
        // Pod IPs directly: meshed (any port, its own identity only), unmeshed, unhealthy-but-meshed.
        (me, "10.244.2.2:9000", 0, Want::Hbone("10.244.2.2:15008", "10.244.2.2:9000", vec!["echo"], None)),
        (me, "10.244.2.9:80", 0, Want::Pass("10.244.2.9:80", Some("plain"))),
        (me, "10.244.2.4:8080", 0, Want::Hbone("10.244.2.4:15008", "10.244.2.4:8080", vec!["echo"], None)),
        // Outside the mesh altogether.
        (me, "192.0.2.1:443", 0, Want::Pass("192.0.2.1:443", None)),
        (me, "192.0.2.1:15001", 0, Want::Pass("192.0.2.1:15001", None)),
        // Local destinations are self-calls, whatever the mesh says.
        (me, "127.0.0.1:15001", 0, Want::Refused("SELF_CALL")),
        (me, "127.0.0.2:80", 0, Want::Refused("SELF_CALL")),
        (me, "[::ffff:127.0.0.1]:15001", 0, Want::Refused("SELF_CALL")),
        (me, "0.0.0.0:15001", 0, Want::Refused("SELF_CALL")),
        (me, "[::1]:443", 0, Want::Refused("SELF_CALL")),
        (me, "10.244.1.5:15001", 0, Want::Refused("SELF_CALL")),
        (me, "10.244.1.5:15008", 0, Want::Refused("SELF_CALL")),
        (me, "10.244.1.5:8080", 0, Want::Refused("SELF_CALL")),
        // The other pods' proxy ports are theirs to refuse, not a self-call here.
        (me, "10.244.2.2:15008", 0, Want::Hbone("10.244.2.2:15008", "10.244.2.2:15008", vec!["echo"], None)),
        // A source the mesh does not know cannot open a tunnel (no identity),
        // but may still reach what is outside the mesh.
        (None, "10.96.0.10:80", 0, Want::Refused("IDENTITY_ERROR")),
        (None, "10.244.2.9:80", 0, Want::Pass("10.244.2.9:80", Some("plain"))),
    ];
    assert!(rows.len() >= 20);
    for (i, (src, dst, draw, want)) in rows.into_iter().enumerate() {
        assert_eq!(run(&s, src, dst, draw), want, "row {i}: {src:?} -> {dst} (draw {draw})");
    }
}

#[test]
fn the_datapaths_endpoint_choice_is_honoured_only_when_this_view_holds_it_ready() {
    let s = state();
    let me = Some(OWN);
    let echo_host = Some("echo.default.svc.cluster.local");
    let b = Want::Hbone("10.244.2.3:15008", "10.244.2.3:8081", vec!["echo", "extra"], echo_host);
    let a = Want::Hbone("10.244.2.2:15008", "10.244.2.2:8080", vec!["echo", "extra"], echo_host);
    // (dialed, chosen at connect(), draw, expected)
    let rows: Vec<(&str, Option<&str>, u64, Want)> = vec![
        // Draw 0 alone picks echo-a; the kernel's choice of echo-b wins.
        ("10.96.0.10:80", None, 0, a.clone()),
        ("10.96.0.10:80", Some("10.244.2.3:8081"), 0, b.clone()),
        ("10.96.0.10:80", Some("10.244.2.2:8080"), 1, a.clone()),
        // Not an endpoint here: echo-b on another port, the unhealthy
        // echo-c, an address the service never had. The draw decides.
        ("10.96.0.10:80", Some("10.244.2.3:8080"), 0, a.clone()),
        ("10.96.0.10:80", Some("10.244.2.4:8080"), 0, a.clone()),
        ("10.96.0.10:80", Some("192.0.2.7:8080"), 1, b.clone()),
        // A choice for a pod address or a service with no endpoint changes nothing.
        ("10.244.2.2:9000", Some("10.244.2.3:8081"), 0, Want::Hbone("10.244.2.2:15008", "10.244.2.2:9000", vec!["echo"], None)),
        ("10.96.0.12:80", Some("10.244.2.3:8081"), 0, Want::Refused("CONNECT")),
    ];
    for (i, (dst, chosen, draw, want)) in rows.into_iter().enumerate() {
        assert_eq!(run_chosen(&s, me, dst, chosen, draw), want, "row {i}: {dst} chosen {chosen:?} (draw {draw})");
    }
}

#[test]
fn the_plan_carries_the_telemetry_labels() {
    let s = state();
    let src = s.workload_by_ip(OWN.parse::<IpAddr>().unwrap());
    let req = Request {
        src,
        src_addr: "10.244.1.5:40000".parse().unwrap(),
        pod_ip: OWN.parse().unwrap(),
        dst: "10.96.0.10:80".parse().unwrap(),
        chosen: None,
        draw: 0,
        loopback_is_local: true,
    };
    let p = plan(&s, &req).unwrap();
    assert_eq!(p.info.reporter, Reporter::Source);
    assert_eq!(p.info.src.as_ref().unwrap().name, "client");
    assert_eq!(p.info.dst.as_ref().unwrap().name, "echo-a");
    assert_eq!(p.info.service.as_ref().unwrap().name, "echo");
}

fn gateway(name: &str) -> GatewayAddress {
    GatewayAddress { namespace: "default".into(), hostname: format!("{name}.default.svc.cluster.local"), hbone_mtls_port: 15008 }
}

/// The table's mesh plus a waypoint `wp` (one ready pod, 10.244.3.3), a
/// waypoint `idle` with no pod, and services and a pod bound to them or to
/// one that does not exist.
fn waypoint_state() -> Arc<MeshState> {
    let mut cfg = MeshConfig::default();
    let mut w = wl("client", OWN, true, "client", 1, None, true);
    cfg.workloads.push(w.clone());
    w = wl("wp-pod", "10.244.3.3", false, "wp", 1, None, true);
    w.services.insert(
        "default/wp.default.svc.cluster.local".into(),
        vec![Port { service_port: 15008, target_port: 15008, app_protocol: Default::default() }],
    );
    cfg.workloads.push(w);
    // A pod of another service account that joined both waypoint
    // Services (by their selectors' labels): never a waypoint endpoint.
    let mut impostor = wl("impostor", "10.244.3.9", false, "impostor", 1, None, true);
    for s in ["wp", "idle"] {
        impostor.services.insert(
            format!("default/{s}.default.svc.cluster.local"),
            vec![Port { service_port: 15008, target_port: 15008, app_protocol: Default::default() }],
        );
    }
    cfg.workloads.push(impostor);
    let mut bound_pod = wl("echo-a", "10.244.2.2", true, "echo", 1, Some(8080), true);
    bound_pod.waypoint = Some(gateway("wp"));
    cfg.workloads.push(bound_pod);
    let mut missing_pod = wl("echo-b", "10.244.2.3", true, "echo", 1, None, true);
    missing_pod.waypoint = Some(gateway("gone"));
    cfg.workloads.push(missing_pod);
    let mut wp = svc("wp", "10.96.0.20", &[]);
    wp.ports = vec![Port { service_port: 15008, target_port: 15008, app_protocol: Default::default() }];
    cfg.services.push(wp);
    let mut idle = svc("idle", "10.96.0.21", &[]);
    idle.ports = vec![Port { service_port: 15008, target_port: 15008, app_protocol: Default::default() }];
    cfg.services.push(idle);
    for (name, vip, to) in [("echo", "10.96.0.10", Some("wp")), ("lost", "10.96.0.11", Some("gone")), ("waits", "10.96.0.12", Some("idle"))]
    {
        let mut s = svc(name, vip, &[]);
        s.waypoint = to.map(gateway);
        cfg.services.push(s);
    }
    // A binding the control plane refused (port 0): the waypoint exists,
    // but does not take this service's traffic.
    let mut s = svc("foreign", "10.96.0.13", &[]);
    s.waypoint = Some(GatewayAddress { hbone_mtls_port: 0, ..gateway("wp") });
    cfg.services.push(s);
    let (s, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    s
}

#[test]
fn waypoint_bound_destinations_go_through_the_waypoint_or_nowhere() {
    let s = waypoint_state();
    let me = Some(OWN);
    let via = |authority: &'static str, host| Want::Hbone("10.244.3.3:15008", authority, vec!["wp"], host);
    // (dialed, chosen at connect(), expected)
    let rows: Vec<(&str, Option<&str>, Want)> = vec![
        // A bound service: to the waypoint (never the impostor, whatever the draw) with the VIP as dialed, expecting
        // the waypoint's identity; the kernel's endpoint choice is ignored.
        ("10.96.0.10:80", None, via("10.96.0.10:80", Some("echo.default.svc.cluster.local"))),
        ("10.96.0.10:80", Some("10.244.2.2:8080"), via("10.96.0.10:80", Some("echo.default.svc.cluster.local"))),
        // Any port of it, even one the service does not list: the waypoint decides.
        ("10.96.0.10:81", None, via("10.96.0.10:81", Some("echo.default.svc.cluster.local"))),
        // A pod bound for workload traffic: its own address as authority.
        ("10.244.2.2:8080", None, via("10.244.2.2:8080", None)),
        // Fail closed: a waypoint that does not exist, or has no ready pod.
        ("10.96.0.11:80", None, Want::Refused("NO_WAYPOINT")),
        ("10.96.0.12:80", None, Want::Refused("NO_WAYPOINT")),
        ("10.96.0.13:80", None, Want::Refused("NO_WAYPOINT")),
        ("10.244.2.3:8080", None, Want::Refused("NO_WAYPOINT")),
    ];
    for (i, (dst, chosen, want)) in rows.into_iter().enumerate() {
        for draw in 0..4 {
            assert_eq!(run_chosen(&s, me, dst, chosen, draw), want, "row {i}: {dst} chosen {chosen:?} draw {draw}");
        }
    }
    // The refusal names what was bound and to which waypoint.
    let req = Request {
        src: s.workload_by_ip(OWN.parse::<IpAddr>().unwrap()),
        src_addr: "10.244.1.5:40000".parse().unwrap(),
        pod_ip: OWN.parse().unwrap(),
        dst: "10.96.0.11:80".parse().unwrap(),
        chosen: None,
        draw: 0,
        loopback_is_local: true,
    };
    let e = plan(&s, &req).unwrap_err();
    assert_eq!(
        e.to_string(),
        "lost.default.svc.cluster.local is bound to waypoint default/gone, which does not exist: refused (traffic never goes around its waypoint)"
    );
}
