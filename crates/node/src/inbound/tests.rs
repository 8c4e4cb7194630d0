//! `plan` as a table: destination lookup, self-calls and authorization
//! (docs/protocols.md section 4), no sockets.

use super::*;
use slipstream_core::policy::*;
use slipstream_core::*;

const ECHO: &str = "c//Pod/default/echo";
const ECHO_IP: &str = "10.244.2.2";

fn wl(name: &str, ns: &str, ip: &str, sa: &str, policies: &[&str]) -> Workload {
    Workload {
        uid: format!("c//Pod/{ns}/{name}"),
        name: name.into(),
        namespace: ns.into(),
        addresses: vec![ip.parse().unwrap()],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: sa.into(),
        authorization_policies: policies.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    }
}

fn policy(ns: &str, name: &str, scope: Scope, action: Action, m: Match) -> Authorization {
    Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope,
        action,
        rules: vec![Rule { clauses: vec![Clause { matches: vec![m] }] }],
        ..Default::default()
    }
}

fn principal(p: &str) -> Vec<StringMatch> {
    vec![StringMatch::Exact(p.into())]
}

/// The mesh of every row: echo (default/echo) selects two policies by
/// workload selector, its namespace has one, the root namespace one more.
fn state() -> Arc<MeshState> {
    let cfg = MeshConfig {
        workloads: vec![
            wl("echo", "default", ECHO_IP, "echo", &["default/only-client", "default/health", "default/dry"]),
            wl("open", "default", "10.244.2.3", "open", &[]),
            wl("client", "default", "10.244.1.5", "client", &[]),
            wl("batch", "jobs", "10.244.1.6", "batch", &[]),
            wl("strict", "secure", "10.244.2.7", "strict", &[]),
        ],
        services: vec![Service {
            name: "echo".into(),
            namespace: "default".into(),
            hostname: "echo.default.svc.cluster.local".into(),
            addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
            ports: vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
            subject_alt_names: vec![],
            waypoint: None,
        }],
        policies: vec![
            // ALLOW only sa/client (and anyone on port 9090).
            policy(
                "default",
                "only-client",
                Scope::WorkloadSelector,
                Action::Allow,
                Match { principals: principal("cluster.local/ns/default/sa/client"), ..Default::default() },
            ),
            policy(
                "default",
                "health",
                Scope::WorkloadSelector,
                Action::Allow,
                Match { destination_ports: vec![9090], ..Default::default() },
            ),
            // Namespace-wide: no one from namespace jobs, on any port.
            policy(
                "default",
                "no-jobs",
                Scope::Namespace,
                Action::Deny,
                Match { namespaces: vec![StringMatch::Exact("jobs".into())], ..Default::default() },
            ),
            // Mesh-wide (root namespace): port 6666 is closed to everyone.
            policy(ROOT_NAMESPACE, "no-6666", Scope::Global, Action::Deny, Match { destination_ports: vec![6666], ..Default::default() }),
            // STRICT for namespace secure: plaintext (no principal) denied.
            policy(
                "secure",
                "strict",
                Scope::Namespace,
                Action::Deny,
                Match { not_principals: vec![StringMatch::Presence], ..Default::default() },
            ),
            // Dry run: would deny 8081; only logged.
            Authorization {
                dry_run: true,
                ..policy(
                    "default",
                    "dry",
                    Scope::WorkloadSelector,
                    Action::Deny,
                    Match { destination_ports: vec![8081], ..Default::default() },
                )
            },
        ],
        net_policies: vec![],
    };
    let (s, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    s
}

fn id(ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", ns, sa).unwrap()
}

/// Runs one row: Ok(app address) or Err(flag, status).
fn run(s: &MeshState, pod: (&str, &str), peer: Option<&SpiffeId>, src: &str, dst: &str) -> Result<String, (&'static str, u16)> {
    let src: SocketAddr = src.parse().unwrap();
    let dst: SocketAddr = dst.parse().unwrap();
    let tunnel_local = peer.map(|_| SocketAddr::new(dst.ip(), 15008));
    let req = Request { pod_uid: pod.0, pod_ip: pod.1.parse().unwrap(), peer, src_addr: src, dst, tunnel_local, forwarded: None };
    let p = plan(s, &req);
    assert_eq!(p.info.reporter, Reporter::Destination);
    assert_eq!(p.info.mutual_tls, peer.is_some());
    match p.target {
        Ok(t) => {
            assert_eq!(t.src_ip, src.ip(), "the app sees the client's address");
            assert_eq!(t.authz.peer.as_ref(), peer, "the decision's inputs are kept for a policy change");
            Ok(t.app.to_string())
        }
        Err(e) => Err((e.flag().as_str(), e.response_code().as_u16())),
    }
}

/// (pod uid and IP, peer identity, source, destination, expected).
type Row<'a> = ((&'a str, &'a str), Option<&'a SpiffeId>, &'a str, &'a str, Result<String, (&'a str, u16)>);

#[test]
fn plans_as_a_table() {
    let s = state();
    let echo = (ECHO, ECHO_IP);
    let open = ("c//Pod/default/open", "10.244.2.3");
    let strict = ("c//Pod/secure/strict", "10.244.2.7");
    let (client, other, batch) = (id("default", "client"), id("default", "other"), id("jobs", "batch"));
    let deny = Err(("DENY", 401));
    // (pod, peer identity, source, destination, expected)
    let rows: Vec<Row> = vec![
        // ALLOW by principal; anyone else refused; the port exception.
        (echo, Some(&client), "10.244.1.5:4000", "10.244.2.2:8080", Ok("10.244.2.2:8080".into())),
        (echo, Some(&other), "10.244.1.9:4000", "10.244.2.2:8080", deny.clone()),
        (echo, Some(&other), "10.244.1.9:4000", "10.244.2.2:9090", Ok("10.244.2.2:9090".into())),
        // Plaintext is no principal: not allowed by the principal rule.
        (echo, None, "10.244.1.5:4000", "10.244.2.2:8080", deny.clone()),
        (echo, None, "10.244.1.5:4000", "10.244.2.2:9090", Ok("10.244.2.2:9090".into())),
        // DENY wins over ALLOW: namespace jobs, even with the port exception.
        (echo, Some(&batch), "10.244.1.6:4000", "10.244.2.2:9090", deny.clone()),
        // Mesh-wide DENY from the root namespace, for every workload.
        (echo, Some(&client), "10.244.1.5:4000", "10.244.2.2:6666", deny.clone()),
        (open, Some(&client), "10.244.1.5:4000", "10.244.2.3:6666", deny.clone()),
        // A workload with no ALLOW policy: allowed unless denied.
        (open, Some(&other), "10.244.1.9:4000", "10.244.2.3:8080", Ok("10.244.2.3:8080".into())),
        (open, None, "192.0.2.1:4000", "10.244.2.3:8080", Ok("10.244.2.3:8080".into())),
        (open, Some(&batch), "10.244.1.6:4000", "10.244.2.3:8080", deny.clone()),
        // STRICT: mTLS passes, plaintext does not.
        (strict, Some(&client), "10.244.1.5:4000", "10.244.2.7:8080", Ok("10.244.2.7:8080".into())),
        (strict, None, "10.244.1.5:4000", "10.244.2.7:8080", deny.clone()),
        (strict, None, "192.0.2.1:4000", "10.244.2.7:443", deny.clone()),
        // A dry-run DENY never decides.
        (echo, Some(&client), "10.244.1.5:4000", "10.244.2.2:8081", Ok("10.244.2.2:8081".into())),
        // The proxy's in-pod ports are self-calls, before any policy.
        (open, None, "192.0.2.1:4000", "10.244.2.3:15001", Err(("SELF_CALL", 503))),
        (open, None, "192.0.2.1:4000", "10.244.2.3:15006", Err(("SELF_CALL", 503))),
        (open, Some(&client), "10.244.1.5:4000", "10.244.2.3:15008", Err(("SELF_CALL", 503))),
        // The admin ports listen in the node's namespace: a pod's own :15020 is its app's.
        (open, None, "192.0.2.1:4000", "10.244.2.3:15020", Ok("10.244.2.3:15020".into())),
        // A pod the mesh does not know (yet): fail closed.
        (("c//Pod/default/ghost", "10.244.2.8"), Some(&client), "10.244.1.5:4000", "10.244.2.8:8080", Err(("CONNECT", 503))),
        (("c//Pod/default/ghost", "10.244.2.8"), None, "10.244.1.5:4000", "10.244.2.8:8080", Err(("CONNECT", 503))),
    ];
    assert!(rows.len() >= 20);
    for (i, (pod, peer, src, dst, want)) in rows.into_iter().enumerate() {
        assert_eq!(run(&s, pod, peer, src, dst), want, "row {i}: {peer:?} {src} -> {dst} at {}", pod.0);
    }
}

#[test]
fn the_plan_carries_identities_addresses_and_the_service() {
    let s = state();
    let client = id("default", "client");
    let req = Request {
        pod_uid: ECHO,
        pod_ip: ECHO_IP.parse().unwrap(),
        peer: Some(&client),
        src_addr: "10.244.1.5:4000".parse().unwrap(),
        dst: "10.244.2.2:8080".parse().unwrap(),
        tunnel_local: Some("10.244.2.2:15008".parse().unwrap()),
        forwarded: Some("for=\"10.244.1.5:4000\";host=echo.default.svc.cluster.local"),
    };
    let p = plan(&s, &req);
    assert!(p.target.is_ok());
    // As ztunnel writes them: dst.addr the tunnel, dst.hbone_addr the target.
    assert_eq!(p.info.dst_addr.to_string(), "10.244.2.2:15008");
    assert_eq!(p.info.hbone_addr.unwrap().to_string(), "10.244.2.2:8080");
    assert_eq!(p.info.src.as_ref().unwrap().name, "client");
    assert_eq!(p.info.dst.as_ref().unwrap().name, "echo");
    assert_eq!(p.info.src_identity(), Some(&client));
    assert_eq!(p.info.src_id, SrcIdentity::OfWorkload, "no copy when it is the source workload's own");
    assert_eq!(p.info.service.as_ref().unwrap().name, "echo", "the service from the forwarded header");
    // A dry-run match is reported for the log.
    let p = plan(&s, &Request { dst: "10.244.2.2:8081".parse().unwrap(), ..req });
    assert_eq!(p.dry_run, vec!["AuthorizationPolicy default/dry spec.rules[0]".to_string()]);
    // Plaintext: the original destination is dst.addr, no hbone_addr.
    let p = plan(&s, &Request { peer: None, tunnel_local: None, forwarded: None, ..req });
    assert_eq!((p.info.dst_addr.to_string(), p.info.hbone_addr), ("10.244.2.2:8080".to_string(), None));
    assert!(p.info.src_identity().is_none());
}

#[test]
fn forwarded_hosts() {
    for (h, want) in [
        ("for=\"1.2.3.4:5\";host=echo.default.svc.cluster.local", Some("echo.default.svc.cluster.local")),
        ("for=1.2.3.4;host=\"a.b.svc.cluster.local\"", Some("a.b.svc.cluster.local")),
        ("for=\"1.2.3.4:5\"", None),
    ] {
        assert_eq!(forwarded_host(h), want, "{h}");
    }
}
