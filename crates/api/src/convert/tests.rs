//! Round trips and refusals: what goes on the wire comes back as it was,
//! and what the model cannot carry is refused naming its field.

use super::*;
use crate::{security, workload};
use slipstream_core::policy::{Action, Authorization, Cidr, Clause, Match, Rule, Scope, StringMatch};
use slipstream_core::{NetworkAddress, Port, Service, TunnelProtocol, Workload, WorkloadStatus, WorkloadType};

fn workload() -> Workload {
    Workload {
        uid: "c//Pod/default/web-0".into(),
        name: "web-0".into(),
        namespace: "default".into(),
        addresses: vec!["10.244.1.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: "web".into(),
        node: "node1".into(),
        canonical_name: "web".into(),
        canonical_revision: "v1".into(),
        workload_type: WorkloadType::Deployment,
        workload_name: "web".into(),
        services: [(
            "default/web.default.svc.cluster.local".to_string(),
            vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
        )]
        .into(),
        authorization_policies: vec!["default/allow-web".into()],
        status: WorkloadStatus::Unhealthy,
        cluster_id: "c".into(),
        capacity: 3,
        ..Default::default()
    }
}

#[test]
fn workload_round_trip() {
    let w = workload();
    let a = address_any(&AddressResource::Workload(w.clone()));
    assert_eq!(a.type_url, crate::ADDRESS_TYPE_URL);
    assert_eq!(address_from_any(&a).unwrap(), AddressResource::Workload(w));
}

#[test]
fn capacity_absent_reads_as_one() {
    let mut w = workload();
    w.capacity = 0;
    let AddressResource::Workload(back) = address_from_any(&address_any(&AddressResource::Workload(w))).unwrap() else { panic!() };
    assert_eq!(back.capacity, 1);
}

#[test]
fn service_round_trip() {
    let s = Service {
        name: "web".into(),
        namespace: "default".into(),
        hostname: "web.default.svc.cluster.local".into(),
        addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
        ports: vec![Port { service_port: 80, target_port: 0, app_protocol: Default::default() }],
        subject_alt_names: vec!["spiffe://cluster.local/ns/default/sa/web".into()],
        waypoint: None,
    };
    let back = address_from_any(&address_any(&AddressResource::Service(s.clone()))).unwrap();
    assert_eq!(back, AddressResource::Service(s.clone()));
    assert_eq!(back.name(), "default/web.default.svc.cluster.local");
}

#[test]
fn authorization_round_trip() {
    let p = Authorization {
        name: "allow-web".into(),
        namespace: "default".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    namespaces: vec![StringMatch::Exact("a".into()), StringMatch::Presence],
                    not_principals: vec![StringMatch::Prefix("cluster.local/ns/x".into())],
                    source_ips: vec![Cidr { address: "10.0.0.0".parse().unwrap(), length: 8 }],
                    destination_ports: vec![8080],
                    not_destination_ports: vec![9090],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: true,
    };
    assert_eq!(authorization_from_any(&authorization_any(&p)).unwrap(), p);
}

#[test]
fn service_accounts_become_principal_suffixes() {
    let wire = security::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        rules: vec![security::Rule {
            clauses: vec![security::Clause {
                matches: vec![security::Match {
                    service_accounts: vec![security::ServiceAccountMatch { namespace: "ns".into(), service_account: "sleep".into() }],
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    };
    let p = Authorization::try_from(wire).unwrap();
    assert_eq!(p.rules[0].clauses[0].matches[0].principals, vec![StringMatch::Suffix("/ns/ns/sa/sleep".into())]);
}

#[test]
fn refusals_name_the_field() {
    let mut w = workload::Workload::from(&workload());
    w.addresses[1] = vec![1, 2, 3];
    assert_eq!(Workload::try_from(w).unwrap_err().field, "workload.addresses[1]");

    let mut w = workload::Workload::from(&workload());
    w.tunnel_protocol = 2;
    assert!(Workload::try_from(w).unwrap_err().message.contains("LEGACY_ISTIO_MTLS"));

    let mut w = workload::Workload::from(&workload());
    w.services.get_mut("default/web.default.svc.cluster.local").unwrap().ports[0].target_port = 70000;
    assert_eq!(Workload::try_from(w).unwrap_err().field, "workload.services[default/web.default.svc.cluster.local].ports[0].target_port");

    let wire = security::Authorization {
        rules: vec![security::Rule {
            clauses: vec![security::Clause {
                matches: vec![security::Match {
                    source_ips: vec![security::Address { address: vec![10, 0, 0, 0], length: 33 }],
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    };
    assert_eq!(Authorization::try_from(wire).unwrap_err().field, "authorization.rules[0].clauses[0].matches[0].source_ips[0].length");

    let mut w = workload::Workload::from(&workload());
    w.waypoint = Some(workload::GatewayAddress { hbone_mtls_port: 15008, ..Default::default() });
    assert_eq!(Workload::try_from(w.clone()).unwrap_err().field, "workload.waypoint");
    w.waypoint = Some(workload::GatewayAddress {
        hbone_mtls_port: 15008,
        destination: Some(workload::gateway_address::Destination::Address(workload::NetworkAddress::default())),
    });
    assert_eq!(Workload::try_from(w.clone()).unwrap_err().field, "workload.waypoint.address");
    let g = slipstream_core::GatewayAddress {
        namespace: "bookinfo".into(),
        hostname: "waypoint.bookinfo.svc.cluster.local".into(),
        hbone_mtls_port: 15008,
    };
    let mut with = workload();
    with.waypoint = Some(g.clone());
    assert_eq!(Workload::try_from(workload::Workload::from(&with)).unwrap().waypoint, Some(g.clone()));
    let mut s = workload::Service::default();
    s.weighted_waypoints.push(Default::default());
    assert_eq!(Service::try_from(s).unwrap_err().field, "service.weighted_waypoints");

    let wire = security::Authorization { action: 7, ..Default::default() };
    assert_eq!(Authorization::try_from(wire).unwrap_err().field, "authorization.action");

    let bad = prost_types::Any { type_url: crate::AUTHORIZATION_TYPE_URL.into(), value: vec![] };
    assert_eq!(address_from_any(&bad).unwrap_err().field, "resource.type_url");
    let garbage = prost_types::Any { type_url: crate::ADDRESS_TYPE_URL.into(), value: vec![0xff, 0xff, 0xff] };
    assert_eq!(address_from_any(&garbage).unwrap_err().field, "resource.value");
    assert_eq!(
        address_from_any(&prost_types::Any { type_url: crate::ADDRESS_TYPE_URL.into(), value: vec![] }).unwrap_err().field,
        "address.type"
    );
}
