//! `wait --for=condition=NAME` and `--for=delete`.

use super::kinds::Kind;
use super::select::{name_of, namespace_of, objects, select, status_condition, wanted, Scope, Selector};
use crate::common::{self, Ctx};
use anyhow::bail;
use serde_json::Value;
use std::time::{Duration, Instant};

/// What `wait --for` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `condition=NAME[=value]`: Ready (pods), Available (deployments), or
    /// any condition in the object's `status.conditions` (Programmed).
    Condition(String, bool),
    Delete,
}

/// `--for`: `condition=NAME[=value]` or `delete`.
pub fn condition(s: &str) -> Result<Condition, String> {
    if s == "delete" {
        return Ok(Condition::Delete);
    }
    let c = s.strip_prefix("condition=").ok_or_else(|| format!("unrecognized condition: {s:?} (use condition=NAME or delete)"))?;
    let (name, value) = match c.split_once('=') {
        Some((n, v)) => (n, v.eq_ignore_ascii_case("true")),
        None => (c, true),
    };
    if name.is_empty() {
        return Err("condition=NAME needs a name (pods have Ready, deployments Available, waypoint Gateways Programmed)".into());
    }
    Ok(Condition::Condition(name.to_string(), value))
}

/// Whether condition `name` of `o` is `want`.
fn holds(k: &Kind, o: &Value, name: &str, want: bool) -> bool {
    let is = match (k.kind, name.to_ascii_lowercase().as_str()) {
        ("Pod", "ready" | "containersready") => {
            o["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        }
        ("Pod", "podscheduled" | "initialized") => true,
        ("Deployment", "available") => {
            o["status"]["availableReplicas"].as_u64().unwrap_or(0) >= o["spec"]["replicas"].as_u64().unwrap_or(1)
        }
        // Any other condition as the object's status states it (a waypoint
        // Gateway's Programmed, a Service's istio.io/WaypointBound); one
        // that is absent holds neither way, as kubectl waits on it.
        _ => return status_condition(o, name) == Some(want),
    };
    is == want
}

/// `wait`'s arguments.
pub struct WaitArgs<'a> {
    pub resources: &'a [String],
    pub scope: Scope,
    pub all: bool,
    pub for_: &'a str,
    pub timeout: Duration,
}

/// `wait --for=condition=Ready pod --all`: each object once it holds
/// (`pod/x condition met`); exit code 1 at the timeout naming what did not.
pub fn wait(ctx: &Ctx, a: WaitArgs) -> anyhow::Result<()> {
    let cond = condition(a.for_).map_err(anyhow::Error::msg)?;
    let wanted = wanted(a.resources).map_err(anyhow::Error::msg)?;
    if wanted.iter().any(|w| w.names.is_empty()) && !a.all && a.scope.selector == Selector::default() {
        bail!("resource(s) were provided, but no name was specified (give names, --all or -l)");
    }
    let deadline = Instant::now() + a.timeout;
    // The objects to wait for are those present at the start (as kubectl).
    let start = objects(ctx)?;
    let mut pending: Vec<(Kind, String, String)> = Vec::new();
    for w in &wanted {
        match select(&start, w, &a.scope) {
            Ok(v) => pending.extend(v.into_iter().map(|o| (w.kind, namespace_of(o).to_string(), name_of(o).to_string()))),
            // Already gone: deleted.
            Err(_) if cond == Condition::Delete => {}
            Err(e) => bail!("{e}"),
        }
    }
    if pending.is_empty() {
        // Already gone is deleted, as kubectl takes it.
        if cond == Condition::Delete {
            return Ok(());
        }
        bail!("no matching resources found");
    }
    loop {
        let now = objects(ctx)?;
        pending.retain(|(k, ns, n)| {
            let o = now.iter().find(|o| o["kind"] == k.kind && namespace_of(o) == ns && name_of(o) == n);
            let done = match (&cond, o) {
                (Condition::Delete, None) => true,
                (Condition::Delete, Some(_)) => false,
                (Condition::Condition(..), None) => false,
                (Condition::Condition(c, v), Some(o)) => holds(k, o, c, *v),
            };
            if done {
                println!("{}/{n} {}", k.resource, if cond == Condition::Delete { "deleted" } else { "condition met" });
            }
            !done
        });
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline || common::interrupted() {
            let names: Vec<String> =
                pending.iter().map(|(k, _, n)| format!("{}/{n}", k.plural.split('.').next().unwrap_or(k.plural))).collect();
            bail!("timed out waiting for the condition on {}", names.join(", "));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_conditions() {
        assert_eq!(condition("condition=Ready"), Ok(Condition::Condition("Ready".into(), true)));
        assert_eq!(condition("condition=Ready=false"), Ok(Condition::Condition("Ready".into(), false)));
        assert_eq!(condition("delete"), Ok(Condition::Delete));
        assert!(condition("jsonpath={.status}").is_err());
        assert!(condition("condition=").is_err());
        assert_eq!(condition("condition=programmed"), Ok(Condition::Condition("programmed".into(), true)));
    }

    #[test]
    fn other_conditions_are_read_from_the_status() {
        let k = &super::super::kinds::kind("Gateway").unwrap();
        let gw = serde_json::json!({"kind": "Gateway", "status": {"conditions": [
            {"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "False"}]}});
        assert!(holds(k, &gw, "accepted", true));
        assert!(holds(k, &gw, "Programmed", false));
        assert!(!holds(k, &gw, "Programmed", true));
        // Absent: holds neither way (kubectl keeps waiting).
        assert!(!holds(k, &gw, "Ready", true) && !holds(k, &gw, "Ready", false));
        assert_eq!(status_condition(&gw, "programmed"), Some(false));
    }
}
