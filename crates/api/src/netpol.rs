//! Network-policy resources (`slipstream.policy.NetworkPolicy`) to and
//! from the model's [`NetPolicy`]. To the wire: total. From the wire: a
//! field the model cannot take is an error naming it.

use crate::convert::{ip_bytes, ip_from_bytes, ConvertError};
use crate::netpolicy as np;
use prost::Message;
use slipstream_core::policy::network::{L4Protocol, NetKind, NetPeer, NetPolicy, NetPort, NetRule, PortSpec};
use slipstream_core::policy::Cidr;
use std::collections::BTreeMap;

fn err(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError { field: field.into(), message: message.into() }
}

fn kind_str(k: NetKind) -> &'static str {
    k.policy_kind().as_str()
}

fn protocol_str(p: L4Protocol) -> &'static str {
    match p {
        L4Protocol::Tcp => "TCP",
        L4Protocol::Udp => "UDP",
        L4Protocol::Sctp => "SCTP",
        L4Protocol::Any => "ANY",
    }
}

fn cidr(c: &Cidr) -> np::Cidr {
    np::Cidr { address: ip_bytes(c.address), length: c.length.into() }
}

fn rule(r: &NetRule) -> np::NetRule {
    let peers = r.peers.iter().flatten().map(|p| np::NetPeer {
        peer: Some(match p {
            NetPeer::Addresses(a) => np::net_peer::Peer::Addresses(np::Addresses { addresses: a.iter().map(|ip| ip_bytes(*ip)).collect() }),
            NetPeer::Block { cidr: c, except } => {
                np::net_peer::Peer::Block(np::Block { cidr: Some(cidr(c)), except: except.iter().map(cidr).collect() })
            }
        }),
    });
    let ports = r.ports.iter().flatten().map(|p| np::NetPort {
        protocol: protocol_str(p.protocol).into(),
        port: Some(match &p.port {
            PortSpec::All => np::net_port::Port::All(true),
            PortSpec::Range { port, end } => np::net_port::Port::Range(np::Range { port: (*port).into(), end: (*end).into() }),
            PortSpec::Named(n) => np::net_port::Port::Named(n.clone()),
        }),
    });
    np::NetRule {
        path: r.path.clone(),
        any_peer: r.peers.is_none(),
        peers: peers.collect(),
        any_port: r.ports.is_none(),
        ports: ports.collect(),
    }
}

impl From<&NetPolicy> for np::NetworkPolicy {
    fn from(p: &NetPolicy) -> Self {
        np::NetworkPolicy {
            kind: kind_str(p.kind).into(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            selected: p.selected.clone(),
            isolates_ingress: p.isolates_ingress,
            isolates_egress: p.isolates_egress,
            ingress: p.ingress.iter().map(rule).collect(),
            egress: p.egress.iter().map(rule).collect(),
            ingress_deny: p.ingress_deny.iter().map(rule).collect(),
            egress_deny: p.egress_deny.iter().map(rule).collect(),
            named_ports: p
                .named_ports
                .iter()
                .map(|(ip, m)| (ip.to_string(), np::NamedPorts { ports: m.iter().map(|(n, p)| (n.clone(), (*p).into())).collect() }))
                .collect(),
        }
    }
}

fn cidr_from(c: Option<&np::Cidr>, field: &str) -> Result<Cidr, ConvertError> {
    let c = c.ok_or_else(|| err(field, "required"))?;
    let address = ip_from_bytes(&c.address, &format!("{field}.address"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    let length = u8::try_from(c.length)
        .ok()
        .filter(|l| u32::from(*l) <= max)
        .ok_or_else(|| err(format!("{field}.length"), format!("{} is not a prefix length", c.length)))?;
    Ok(Cidr { address, length })
}

fn port16(v: u32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(v).ok().filter(|p| *p > 0).ok_or_else(|| err(field, format!("{v} is not a port")))
}

fn rule_from(r: &np::NetRule, field: &str) -> Result<NetRule, ConvertError> {
    let mut peers = Vec::new();
    for (i, p) in r.peers.iter().enumerate() {
        let f = format!("{field}.peers[{i}]");
        peers.push(match &p.peer {
            Some(np::net_peer::Peer::Addresses(a)) => {
                let mut ips = a
                    .addresses
                    .iter()
                    .enumerate()
                    .map(|(j, b)| ip_from_bytes(b, &format!("{f}.addresses[{j}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                ips.sort();
                NetPeer::Addresses(ips)
            }
            Some(np::net_peer::Peer::Block(b)) => NetPeer::Block {
                cidr: cidr_from(b.cidr.as_ref(), &format!("{f}.cidr"))?,
                except: b
                    .except
                    .iter()
                    .enumerate()
                    .map(|(j, c)| cidr_from(Some(c), &format!("{f}.except[{j}]")))
                    .collect::<Result<_, _>>()?,
            },
            None => return Err(err(f, "has neither addresses nor a block")),
        });
    }
    let mut ports = Vec::new();
    for (i, p) in r.ports.iter().enumerate() {
        let f = format!("{field}.ports[{i}]");
        let protocol = match p.protocol.as_str() {
            "TCP" => L4Protocol::Tcp,
            "UDP" => L4Protocol::Udp,
            "SCTP" => L4Protocol::Sctp,
            "ANY" => L4Protocol::Any,
            other => return Err(err(format!("{f}.protocol"), format!("unknown protocol {other:?}"))),
        };
        let port = match &p.port {
            Some(np::net_port::Port::All(_)) => PortSpec::All,
            Some(np::net_port::Port::Range(r)) => {
                let (port, end) = (port16(r.port, &format!("{f}.range.port"))?, port16(r.end, &format!("{f}.range.end"))?);
                if end < port {
                    return Err(err(format!("{f}.range.end"), "is below the port"));
                }
                PortSpec::Range { port, end }
            }
            Some(np::net_port::Port::Named(n)) if !n.is_empty() => PortSpec::Named(n.clone()),
            _ => return Err(err(format!("{f}.port"), "required")),
        };
        ports.push(NetPort { protocol, port });
    }
    if r.any_peer && !peers.is_empty() {
        return Err(err(format!("{field}.any_peer"), "set together with peers"));
    }
    if r.any_port && !ports.is_empty() {
        return Err(err(format!("{field}.any_port"), "set together with ports"));
    }
    Ok(NetRule { peers: (!r.any_peer).then_some(peers), ports: (!r.any_port).then_some(ports), path: r.path.clone() })
}

fn rules_from(rs: &[np::NetRule], field: &str) -> Result<Vec<NetRule>, ConvertError> {
    rs.iter().enumerate().map(|(i, r)| rule_from(r, &format!("{field}[{i}]"))).collect()
}

impl TryFrom<np::NetworkPolicy> for NetPolicy {
    type Error = ConvertError;
    fn try_from(p: np::NetworkPolicy) -> Result<Self, ConvertError> {
        let kind = match p.kind.as_str() {
            "NetworkPolicy" => NetKind::NetworkPolicy,
            "CiliumNetworkPolicy" => NetKind::CiliumNetworkPolicy,
            other => return Err(err("kind", format!("unknown kind {other:?}"))),
        };
        let mut named_ports = BTreeMap::new();
        for (ip, ports) in &p.named_ports {
            let addr = ip.parse().map_err(|_| err(format!("named_ports[{ip:?}]"), "not an IP address"))?;
            let mut m = BTreeMap::new();
            for (n, port) in &ports.ports {
                m.insert(n.clone(), port16(*port, &format!("named_ports[{ip:?}].ports[{n:?}]"))?);
            }
            named_ports.insert(addr, m);
        }
        Ok(NetPolicy {
            kind,
            ingress: rules_from(&p.ingress, "ingress")?,
            egress: rules_from(&p.egress, "egress")?,
            ingress_deny: rules_from(&p.ingress_deny, "ingress_deny")?,
            egress_deny: rules_from(&p.egress_deny, "egress_deny")?,
            namespace: p.namespace,
            name: p.name,
            selected: p.selected,
            isolates_ingress: p.isolates_ingress,
            isolates_egress: p.isolates_egress,
            named_ports,
        })
    }
}

pub fn net_policy_any(p: &NetPolicy) -> prost_types::Any {
    crate::convert::to_any(crate::TypeUrl::NetworkPolicy, &np::NetworkPolicy::from(p))
}

/// Unpacks a `NetworkPolicy` resource, checking its type URL.
pub fn net_policy_from_any(any: &prost_types::Any) -> Result<NetPolicy, ConvertError> {
    if any.type_url != crate::NETWORK_POLICY_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::NETWORK_POLICY_TYPE_URL, any.type_url)));
    }
    let p = np::NetworkPolicy::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not a NetworkPolicy: {e}")))?;
    p.try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let p = NetPolicy {
            kind: NetKind::CiliumNetworkPolicy,
            namespace: "prod".into(),
            name: "billing".into(),
            selected: vec!["Kubernetes//Pod/prod/billing-0".into()],
            isolates_ingress: true,
            isolates_egress: false,
            ingress: vec![NetRule {
                peers: Some(vec![
                    NetPeer::Addresses(vec!["10.244.1.2".parse().unwrap(), "10.244.2.9".parse().unwrap()]),
                    NetPeer::Block {
                        cidr: Cidr { address: "10.0.0.0".parse().unwrap(), length: 8 },
                        except: vec![Cidr { address: "10.1.0.0".parse().unwrap(), length: 16 }],
                    },
                ]),
                ports: Some(vec![
                    NetPort { protocol: L4Protocol::Tcp, port: PortSpec::Range { port: 8080, end: 8090 } },
                    NetPort { protocol: L4Protocol::Any, port: PortSpec::Named("http".into()) },
                    NetPort { protocol: L4Protocol::Udp, port: PortSpec::All },
                ]),
                path: "spec.ingress[0]".into(),
            }],
            egress: vec![NetRule { peers: None, ports: None, path: "spec.egress[0]".into() }],
            ingress_deny: vec![NetRule { peers: Some(vec![]), ports: None, path: "spec.ingressDeny[0]".into() }],
            egress_deny: vec![],
            named_ports: [("10.244.1.2".parse().unwrap(), [("http".to_string(), 8080)].into())].into(),
        };
        assert_eq!(net_policy_from_any(&net_policy_any(&p)).unwrap(), p);
    }

    #[test]
    fn refusals_name_the_field() {
        let mut m = np::NetworkPolicy::from(&NetPolicy { name: "x".into(), namespace: "y".into(), ..Default::default() });
        m.ingress.push(np::NetRule {
            any_peer: true,
            ports: vec![np::NetPort { protocol: "TCP".into(), port: Some(np::net_port::Port::Range(np::Range { port: 9, end: 8 })) }],
            ..Default::default()
        });
        let e = NetPolicy::try_from(m).unwrap_err();
        assert_eq!(e.field, "ingress[0].ports[0].range.end");
    }
}
