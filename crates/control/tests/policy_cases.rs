//! The semantic cases of tests/data/policy-cases.yaml (expected answers
//! written from Istio's, Kubernetes' and Cilium's documentation, each
//! citing its source), answered by the policy engine over the state this
//! control plane computes from the manifests: what `slipstream policy
//! check -f` does. The same cases run as real traffic in the local
//! cluster (crates/cli/tests/policy_traffic.rs).

use slipstream_control::index::{mesh_from_manifests, IndexSettings};
use slipstream_core::engine::{self, Answer, Question};
use slipstream_core::MeshState;

#[path = "data/cases.rs"]
#[allow(dead_code)]
mod cases;
use cases::WORLD;

/// `Kind ns/name` of every policy an answer names as deciding: for a
/// denial the denying layer's rule or the policies that required an
/// allow; for an allow the allowing rules.
fn deciders(a: &Answer) -> Vec<String> {
    let d = &a.detail;
    let name = |p: &slipstream_core::policy::PolicyRule| format!("{} {}/{}", p.kind.as_str(), p.namespace, p.name);
    match d.denial() {
        Some(l) => l.by.iter().chain(l.candidates.iter()).map(name).collect(),
        None => [&d.egress, &d.ingress.network, &d.ingress.istio].iter().filter_map(|l| l.by.as_ref()).map(name).collect(),
    }
}

#[test]
fn semantic_cases_through_the_engine() {
    let cases = cases::load();
    assert!(cases.cases.len() >= 80, "the table must hold at least 80 cases, has {}", cases.cases.len());
    let mut failures = Vec::new();
    let mut checks = 0;
    let mut ids = std::collections::BTreeSet::new();
    for case in &cases.cases {
        assert!(ids.insert(case.id.clone()), "duplicate case id {}", case.id);
        assert!(!case.source.trim().is_empty(), "{}: every case cites its source", case.id);
        let text = format!("{WORLD}\n---\n{}", case.objects);
        let cfg = match mesh_from_manifests(&text, IndexSettings::default()) {
            Ok(c) => c,
            Err(errs) => {
                failures.push(format!("{}: manifests refused: {errs:?}", case.id));
                continue;
            }
        };
        let (state, refused) = MeshState::from_config(&cfg);
        assert!(refused.is_empty(), "{}: {refused:?}", case.id);
        for c in &case.checks {
            checks += 1;
            let (to, port) = c.to.rsplit_once(':').expect("to is NS/POD:PORT");
            let q = Question { from: c.from.parse().unwrap(), to: to.parse().unwrap(), port: port.parse().unwrap() };
            let a = match engine::check(&state, &q) {
                Ok(a) => a,
                Err(e) => {
                    failures.push(format!("{}: {} -> {}: {e}", case.id, c.from, c.to));
                    continue;
                }
            };
            if a.verdict != c.expect {
                failures.push(format!(
                    "{} ({}): {} -> {}: expected {}, got {} ({})\n  source: {}",
                    case.id,
                    case.title,
                    c.from,
                    c.to,
                    c.expect,
                    a.verdict,
                    serde_json::to_string(&a.detail).unwrap(),
                    case.source
                ));
                continue;
            }
            if let Some(by) = &c.by {
                let got = deciders(&a);
                if !got.iter().any(|g| g == by) {
                    failures.push(format!("{}: {} -> {}: expected {by} to decide, got {got:?}", case.id, c.from, c.to));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checks} checks failed:\n{}", failures.len(), failures.join("\n"));
}
