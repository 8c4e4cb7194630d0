//! Readiness (`:15021/healthz/ready`) as a pure function: ready when the
//! mesh configuration has arrived, every pod this node should serve has its
//! listeners bound, and each such pod's certificate is valid now.
//! Otherwise not ready, with one line per reason.

use slipstream_core::SpiffeId;
use slipstream_identity::{CertStatus, CertSummary};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// What readiness is decided from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The mesh configuration was loaded at least once.
    pub config_loaded: bool,
    /// The pods this node should serve, by uid: their identity (None while
    /// the mesh configuration does not name them yet) and whether their
    /// listeners are bound.
    pub pods: BTreeMap<String, PodState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    pub identity: Option<SpiffeId>,
    pub listening: bool,
}

/// Ok, or the reasons it is not ready (sorted, one per line in the body).
pub fn evaluate(inputs: &Inputs, certs: &[CertSummary], now: SystemTime) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    if !inputs.config_loaded {
        why.push("the mesh configuration has not arrived yet".to_string());
    }
    for (uid, p) in &inputs.pods {
        let Some(id) = &p.identity else {
            why.push(format!("pod {uid}: not in the mesh configuration yet"));
            continue;
        };
        if !p.listening {
            why.push(format!("pod {uid}: listeners not bound"));
        }
        match certs.iter().find(|c| &c.identity == id).map(|c| &c.status) {
            None | Some(CertStatus::Pending) => why.push(format!("pod {uid}: certificate for {id} not issued yet")),
            Some(CertStatus::Failed { error }) => why.push(format!("pod {uid}: certificate for {id}: {error}")),
            Some(CertStatus::Ready { not_before, not_after, .. }) => {
                if now < *not_before || now >= *not_after {
                    why.push(format!("pod {uid}: certificate for {id} is not valid now"));
                }
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(sa: &str) -> SpiffeId {
        SpiffeId::new("cluster.local", "default", sa).unwrap()
    }

    fn ready(sa: &str, now: SystemTime, from: i64, to: i64) -> CertSummary {
        let at = |s: i64| if s >= 0 { now + Duration::from_secs(s as u64) } else { now - Duration::from_secs((-s) as u64) };
        CertSummary {
            identity: id(sa),
            status: CertStatus::Ready { serial: "1".into(), not_before: at(from), not_after: at(to), renew_at: at(to / 2) },
        }
    }

    fn pod(sa: Option<&str>, listening: bool) -> PodState {
        PodState { identity: sa.map(id), listening }
    }

    #[test]
    fn readiness_as_a_table() {
        let now = SystemTime::now();
        let inputs = |loaded: bool, pods: Vec<(&str, PodState)>| Inputs {
            config_loaded: loaded,
            pods: pods.into_iter().map(|(u, p)| (u.to_string(), p)).collect(),
        };
        // (inputs, certificates, expected reasons; empty = ready)
        let rows: Vec<(Inputs, Vec<CertSummary>, Vec<&str>)> = vec![
            (inputs(true, vec![]), vec![], vec![]),
            (inputs(false, vec![]), vec![], vec!["the mesh configuration has not arrived yet"]),
            (inputs(true, vec![("a", pod(Some("a"), true))]), vec![ready("a", now, -10, 3600)], vec![]),
            (inputs(true, vec![("a", pod(Some("a"), false))]), vec![ready("a", now, -10, 3600)], vec!["pod a: listeners not bound"]),
            (
                inputs(true, vec![("a", pod(Some("a"), true))]),
                vec![],
                vec!["pod a: certificate for spiffe://cluster.local/ns/default/sa/a not issued yet"],
            ),
            (
                inputs(true, vec![("a", pod(Some("a"), true))]),
                vec![ready("a", now, -7200, -10)],
                vec!["pod a: certificate for spiffe://cluster.local/ns/default/sa/a is not valid now"],
            ),
            (
                inputs(true, vec![("a", pod(Some("a"), true))]),
                vec![CertSummary { identity: id("a"), status: CertStatus::Failed { error: "CA unreachable".into() } }],
                vec!["pod a: certificate for spiffe://cluster.local/ns/default/sa/a: CA unreachable"],
            ),
            (inputs(true, vec![("b", pod(None, false))]), vec![], vec!["pod b: not in the mesh configuration yet"]),
            (
                inputs(false, vec![("a", pod(Some("a"), true)), ("b", pod(Some("b"), false))]),
                vec![ready("a", now, -10, 3600), ready("b", now, -10, 3600)],
                vec!["the mesh configuration has not arrived yet", "pod b: listeners not bound"],
            ),
        ];
        for (i, (inputs, certs, want)) in rows.into_iter().enumerate() {
            let got = evaluate(&inputs, &certs, now).err().unwrap_or_default();
            assert_eq!(got, want, "row {i}");
        }
    }
}
