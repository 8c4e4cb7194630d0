//! The kernel may only deny what the node proxy would deny, and should
//! deny what it can: for every semantic case of the policy table
//! (crates/control/tests/data/policy-cases.yaml, answers written from
//! Istio's, Kubernetes' and Cilium's documentation), the policy map that
//! `policy::compile` writes is looked up as the connect hook looks it up,
//! and compared with the engine's answer, on the case's ports and on ports
//! no policy names. Pure: no kernel needed.

use slipstream_control::index::{mesh_from_manifests, IndexSettings};
use slipstream_core::policy::engine;
use slipstream_core::policy::network::L4Protocol;
use slipstream_core::MeshState;
use slipstream_ebpf::abi::{PolicyKey, PolicyValue, POLICY_DENY};
use slipstream_ebpf::policy::compile;
use std::collections::BTreeMap;
use std::net::IpAddr;

#[path = "../../control/tests/data/cases.rs"]
#[allow(dead_code)]
mod cases;

/// What connect4.c does with the map: the port's entry, else the pair's.
fn kernel_denies(map: &BTreeMap<PolicyKey, PolicyValue>, src: IpAddr, dst: IpAddr, port: u16) -> bool {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else { return false };
    let v = map.get(&PolicyKey::tcp(s, d, port)).or_else(|| map.get(&PolicyKey::tcp(s, d, 0)));
    v.is_some_and(|v| v.verdict == POLICY_DENY)
}

#[test]
fn the_kernel_map_agrees_with_the_engine_on_every_case() {
    let cases = cases::load();
    let mut failures = Vec::new();
    let (mut compared, mut kernel_denials) = (0, 0);
    for case in &cases.cases {
        let cfg = mesh_from_manifests(&format!("{}\n---\n{}", cases::WORLD, case.objects), IndexSettings::default())
            .unwrap_or_else(|e| panic!("{}: {e:?}", case.id));
        let (state, _) = MeshState::from_config(&cfg);
        let mut map = BTreeMap::new();
        let mut rules = Vec::new();
        for node in ["node1", "node2"] {
            let c = compile(&state, node);
            assert_eq!(c.skipped_pairs, 0, "{}: no case has a port range too wide to compile", case.id);
            for v in c.entries.values() {
                assert!(v.rule == 0 || (v.rule as usize) <= c.rules.len(), "{}: a rule reference points nowhere", case.id);
            }
            map.extend(c.entries);
            rules.extend(c.rules);
        }
        for chk in &case.checks {
            let (to, port) = chk.to.rsplit_once(':').unwrap();
            let port: u16 = port.parse().unwrap();
            let (fns, fname) = chk.from.split_once('/').unwrap();
            let (tns, tname) = to.split_once('/').unwrap();
            let find = |ns: &str, name: &str| state.workloads().find(|w| w.namespace == ns && w.name == name).cloned();
            let (Some(src), Some(dst)) = (find(fns, fname), find(tns, tname)) else { continue };
            // The case's own port, its neighbours and the extremes: the
            // last ones stand for the ports no policy names.
            for p in [port, port.saturating_sub(1).max(1), port.saturating_add(1), 1, 65535] {
                compared += 1;
                let engine_denies = !engine::connection(&state, &src, &dst, L4Protocol::Tcp, p).allowed;
                let kernel = kernel_denies(&map, src.address(), dst.address(), p);
                kernel_denials += kernel as usize;
                if kernel != engine_denies {
                    failures.push(format!(
                        "{}: {} -> {}:{p}: engine {}, kernel map {}",
                        case.id,
                        chk.from,
                        to,
                        if engine_denies { "denies" } else { "allows" },
                        if kernel { "denies" } else { "has no deny" }
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} disagreement(s):\n{}", failures.len(), failures.join("\n"));
    assert!(compared > 400 && kernel_denials > 100, "the table exercises the map: {compared} compared, {kernel_denials} kernel denials");
}
