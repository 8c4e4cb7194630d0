//! The gateway controller on Kubernetes: applies what each waypoint
//! Gateway makes and writes the status Istio writes.
//!
//! It sees the objects through the control plane's own watchers (the
//! `kubernetes` source hands every Namespace, Service, Gateway and waypoint
//! Pod it reads to a [`Mirror`]), so it opens no watch of its own. It is
//! level-triggered: whenever the mirror changes (after a short pause that
//! gathers a burst) and at every resync, it computes what should be
//! ([`render::objects`], [`status::compute`]) and writes only what differs
//! from what the API server holds:
//!
//! - the made objects by server-side apply (field manager `slipstream`,
//!   forced), when their rendering changed or at each resync, so one
//!   deleted or edited by hand is restored within a resync;
//! - the status by server-side apply on the `status` subresource (field
//!   manager `slipstream-status`), only when a condition's status, reason
//!   or message, the addresses or the observed generation differ;
//!   `lastTransitionTime` moves only when a condition's status does. A
//!   Service that stops asking for a waypoint loses the condition (the
//!   field manager no longer applies it).
//!
//! Several control plane replicas write the same objects and the same
//! status, and each writes only what differs, so they converge without a
//! leader. A failed write is logged (once per object until it succeeds)
//! and tried again [`RETRY`] later.

use super::str_at;
use super::{render, status};
use crate::source::kube::RawEvent;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{json, Value};
use slipstream_core::sync::LockExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The field manager of the made objects.
pub const FIELD_MANAGER: &str = "slipstream";
/// The field manager of the status (a separate one, so that applying the
/// objects never touches the status and the other way round).
pub const STATUS_MANAGER: &str = "slipstream-status";
/// How long a burst of changes is gathered before acting on it.
pub const SETTLE: Duration = Duration::from_millis(200);
/// How soon a failed write is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    pub deploy: render::DeploySettings,
    /// The cluster's DNS domain (the Programmed message names the
    /// waypoint's host in it).
    pub domain: String,
    /// How often everything is applied again even when nothing changed.
    pub resync: Duration,
}

type Key = (&'static str, String, String);

/// The objects the controller decides from, as the API server last served
/// them: Namespaces, Services, Gateways, and the Pods of waypoints.
#[derive(Default)]
pub struct Mirror {
    objects: Mutex<BTreeMap<Key, Value>>,
    /// The kinds whose watcher has listed them whole (or found them not
    /// served): nothing is decided before all four have.
    listed: Mutex<BTreeSet<&'static str>>,
    changed: Notify,
}

/// Set on a mirrored object whose status has fields of [`STATUS_MANAGER`]
/// (read from `managedFields`, which the mirror does not keep): only then
/// is a condition left from before cleared. Never sent anywhere.
pub const STATUS_OWNED: &str = "x-slipstream-status-owned";

/// Whether `o`'s `managedFields` give status fields to [`STATUS_MANAGER`].
fn status_owned(o: &Value) -> bool {
    o.pointer("/metadata/managedFields").and_then(Value::as_array).is_some_and(|fields| {
        fields.iter().any(|f| f["manager"] == STATUS_MANAGER && f["fieldsV1"]["f:status"].as_object().is_some_and(|m| !m.is_empty()))
    })
}

const KINDS: [&str; 4] = ["Namespace", "Service", "Gateway", "Pod"];

impl Mirror {
    /// Takes in what a watcher saw (everything else is ignored).
    pub fn observe(&self, ev: &RawEvent) {
        let mut objects = self.objects.locked();
        let changed = match ev {
            RawEvent::Apply(v) => {
                let Some(kind) = KINDS.into_iter().find(|k| v["kind"] == *k) else { return };
                let key = (kind, str_at(v, "/metadata/namespace").to_string(), str_at(v, "/metadata/name").to_string());
                // Only the pods of waypoints say anything here (is one ready).
                let wanted = kind != "Pod" || v.pointer(&format!("/metadata/labels/{}", GATEWAY_LABEL_POINTER)).is_some();
                if !wanted {
                    objects.remove(&key).is_some()
                } else {
                    let mut v = v.clone();
                    let owned = status_owned(&v);
                    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("managedFields");
                    }
                    if owned {
                        v[STATUS_OWNED] = json!(true);
                    }
                    objects.insert(key, v.clone()).as_ref() != Some(&v)
                }
            }
            RawEvent::Delete { kind, namespace, name } => objects.remove(&(*kind, namespace.clone(), name.clone())).is_some(),
            RawEvent::Relisted { kind, present } => {
                let before = objects.len();
                objects.retain(|(k, ns, name), _| k != kind || present.contains(&(ns.clone(), name.clone())));
                objects.len() != before || self.listed(kind)
            }
            RawEvent::Absent { kind } => self.listed(kind),
        };
        if changed {
            self.changed.notify_one();
        }
    }

    /// Notes that `kind` was listed whole; true the first time.
    fn listed(&self, kind: &str) -> bool {
        let Some(k) = KINDS.into_iter().find(|k| *k == kind) else { return false };
        self.listed.locked().insert(k)
    }

    /// Every kind the controller reads has been listed whole once.
    pub fn synced(&self) -> bool {
        self.listed.locked().len() == KINDS.len()
    }

    fn snapshot(&self) -> Vec<Value> {
        self.objects.locked().values().cloned().collect()
    }
}

/// The gateway-name label, escaped for a JSON pointer.
const GATEWAY_LABEL_POINTER: &str = "gateway.networking.k8s.io~1gateway-name";

/// One write: what to apply, and where.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Server-side apply of a made object.
    Object(Value),
    /// Server-side apply of `{"status": ...}` on an object's status.
    Status { kind: &'static str, namespace: String, name: String, status: Value },
}

impl Write {
    fn describe(&self) -> String {
        match self {
            Write::Object(o) => format!("{} {}/{}", str_at(o, "/kind"), str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name")),
            Write::Status { kind, namespace, name, .. } => format!("the status of {kind} {namespace}/{name}"),
        }
    }
}

fn same_condition(a: &Value, b: &Value) -> bool {
    ["type", "status", "reason", "message"].iter().all(|f| a[f] == b[f])
}

/// The status to write on `o` for `desired` (from [`status::compute`], or
/// none at all), or None when what it has already says it. Conditions gain
/// `lastTransitionTime` (kept from the object while their status holds,
/// else `now`) and the object's `observedGeneration`.
pub fn status_write(o: &Value, desired: Option<&Value>, now: &str) -> Option<Value> {
    let have = o["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let generation = o.pointer("/metadata/generation").and_then(Value::as_i64);
    let Some(desired) = desired else {
        // Nothing to say: what this controller wrote before goes (a
        // Service that stopped asking for a waypoint, a Gateway no longer
        // of the waypoint class). Applying nothing removes only this field
        // manager's fields; once it owns none, nothing is written.
        return (o[STATUS_OWNED] == true).then(|| json!({}));
    };
    let want = desired["conditions"].as_array().cloned().unwrap_or_default();
    let mut differs = desired.get("addresses") != o["status"].get("addresses");
    let mut conditions = Vec::new();
    for w in &want {
        let old = have.iter().find(|h| h["type"] == w["type"]);
        differs |= !old.is_some_and(|h| same_condition(h, w) && h.get("observedGeneration").and_then(Value::as_i64) == generation);
        let mut c = w.clone();
        let since = old.filter(|h| h["status"] == w["status"]).and_then(|h| h.get("lastTransitionTime")).cloned();
        c["lastTransitionTime"] = since.unwrap_or_else(|| json!(now));
        if let Some(g) = generation {
            c["observedGeneration"] = json!(g);
        }
        conditions.push(c);
    }
    if !differs {
        return None;
    }
    let mut out = json!({"conditions": conditions});
    if let Some(a) = desired.get("addresses") {
        out["addresses"] = a.clone();
    }
    Some(out)
}

/// A Gateway by `(namespace, name)`.
pub type GatewayKey = (String, String);

fn gateway_key(gw: &Value) -> GatewayKey {
    (str_at(gw, "/metadata/namespace").to_string(), str_at(gw, "/metadata/name").to_string())
}

fn deleting(o: &Value) -> bool {
    o.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

/// The waypoint Gateways whose objects may be applied, with them: valid
/// (an invalid one makes nothing; its status says why), not being
/// deleted, and not known to collide with someone else's object.
fn deployable<'a>(
    objects: &'a [Value],
    settings: &ControllerSettings,
    conflicts: &HashMap<GatewayKey, String>,
) -> Vec<(&'a Value, Vec<Value>)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Gateway" && !deleting(o) && status::invalid_waypoint(o).is_none())
        .filter(|gw| !conflicts.contains_key(&gateway_key(gw)))
        .filter_map(|gw| Some((gw, render::objects(gw, &settings.deploy)?)))
        .collect()
}

/// Everything to write for `objects` (a snapshot of the mirror): the made
/// objects of every waypoint Gateway whose rendering is not in `applied`
/// (by Gateway, the last rendering applied), and every status that
/// differs. A Gateway in `conflicts` (a name one of its objects needs is
/// taken by an object it does not own; with the message) makes nothing
/// and is not Programmed. Objects being deleted are left alone. Pure.
pub fn plan(
    objects: &[Value],
    settings: &ControllerSettings,
    applied: &HashMap<GatewayKey, Vec<Value>>,
    conflicts: &HashMap<GatewayKey, String>,
    now: &str,
) -> Vec<Write> {
    let mut writes = Vec::new();
    for (gw, made) in deployable(objects, settings, conflicts) {
        if applied.get(&gateway_key(gw)) != Some(&made) {
            writes.extend(made.into_iter().map(Write::Object));
        }
    }
    let mut desired: BTreeMap<usize, Value> = status::compute(objects, &settings.domain, Some(&settings.deploy)).into_iter().collect();
    for (i, o) in objects.iter().enumerate() {
        if o["kind"] != "Gateway" {
            continue;
        }
        if let Some(why) = conflicts.get(&gateway_key(o)) {
            desired.insert(
                i,
                json!({"conditions": [
                    {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Resource accepted"},
                    {"type": "Programmed", "status": "False", "reason": "Invalid", "message": why},
                ]}),
            );
        }
    }
    for (i, o) in objects.iter().enumerate() {
        let kind = match o["kind"].as_str() {
            Some("Gateway") => "Gateway",
            Some("Service") => "Service",
            _ => continue,
        };
        if deleting(o) {
            continue;
        }
        if let Some(s) = status_write(o, desired.get(&i), now) {
            writes.push(Write::Status {
                kind,
                namespace: str_at(o, "/metadata/namespace").into(),
                name: str_at(o, "/metadata/name").into(),
                status: s,
            });
        }
    }
    writes
}

fn resource(api_version: &str, kind: &str) -> Option<ApiResource> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "ServiceAccount" => "serviceaccounts",
        "Deployment" => "deployments",
        "Service" => "services",
        "Gateway" => "gateways",
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural))
}

async fn write(client: &kube::Client, w: &Write) -> Result<(), kube::Error> {
    match w {
        Write::Object(o) => {
            let ar = resource(str_at(o, "/apiVersion"), str_at(o, "/kind")).expect("a made kind");
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), str_at(o, "/metadata/namespace"), &ar);
            api.patch(str_at(o, "/metadata/name"), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(o)).await?;
        }
        Write::Status { kind, namespace, name, status } => {
            let api_version = if *kind == "Gateway" { "gateway.networking.k8s.io/v1" } else { "v1" };
            let ar = resource(api_version, kind).expect("a status kind");
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &ar);
            let body =
                json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}, "status": status});
            api.patch_status(name, &PatchParams::apply(STATUS_MANAGER).force(), &Patch::Apply(&body)).await?;
        }
    }
    Ok(())
}

/// Whether a name of `made` is taken by an object not owned by the
/// Gateway `uid`: the message for its status.
async fn taken_by_another(client: &kube::Client, uid: &str, made: &[Value]) -> Result<Option<String>, kube::Error> {
    for o in made {
        let (kind, ns, name) = (str_at(o, "/kind"), str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name"));
        let Some(ar) = resource(str_at(o, "/apiVersion"), kind) else { continue };
        let Some(existing) = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar).get_opt(name).await? else { continue };
        if !existing.metadata.owner_references.iter().flatten().any(|r| r.uid == uid) {
            return Ok(Some(format!(
                "{kind} {ns}/{name} already exists and is not this Gateway's: it is left as it is and nothing is deployed; \
                 rename the Gateway or remove that {kind}"
            )));
        }
    }
    Ok(None)
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Runs the controller until the task is aborted. `settings` is read
/// again at each pass (the root bundle in it may rotate).
pub async fn run(client: kube::Client, mirror: Arc<Mirror>, settings: impl Fn() -> ControllerSettings + Send + 'static) {
    let mut applied: HashMap<GatewayKey, Vec<Value>> = HashMap::new();
    let mut failing: BTreeSet<String> = BTreeSet::new();
    // Nothing is decided from a half-read cluster: a Service whose
    // Gateway has not been listed yet would be marked WaypointNotFound.
    while !mirror.synced() {
        mirror.changed.notified().await;
    }
    tokio::time::sleep(SETTLE).await;
    let mut next_resync = tokio::time::Instant::now();
    loop {
        let settings = settings();
        let resync = tokio::time::Instant::now() >= next_resync;
        if resync {
            applied.clear();
            next_resync = tokio::time::Instant::now() + settings.resync;
        }
        let objects = mirror.snapshot();
        // Before a Gateway's first apply (and at every resync): are its
        // objects' names free, or its own? A forced apply would take over
        // a user's ServiceAccount, Deployment or Service of the same name,
        // and deleting the Gateway would then delete them.
        let mut conflicts: HashMap<GatewayKey, String> = HashMap::new();
        for (gw, made) in deployable(&objects, &settings, &HashMap::new()) {
            let key = gateway_key(gw);
            if applied.contains_key(&key) {
                continue;
            }
            match taken_by_another(&client, str_at(gw, "/metadata/uid"), &made).await {
                Ok(Some(why)) => {
                    conflicts.insert(key, why);
                }
                Ok(None) => {}
                Err(e) => {
                    // Unknown: not applied this pass, checked again soon.
                    tracing::warn!(gateway = %format!("{}/{}", key.0, key.1), "cannot check the names of its objects: {e}");
                    conflicts.insert(key, format!("the names of its objects could not be checked yet: {e}"));
                }
            }
        }
        let writes = plan(&objects, &settings, &applied, &conflicts, &now_rfc3339());
        let mut failed = false;
        let mut done: BTreeSet<(String, String)> = BTreeSet::new();
        let mut refused: BTreeSet<(String, String)> = BTreeSet::new();
        for w in &writes {
            let what = w.describe();
            match write(&client, w).await {
                Ok(()) => {
                    if failing.remove(&what) {
                        tracing::info!(object = %what, "written again after failures");
                    } else {
                        tracing::debug!(object = %what, "written");
                    }
                    if let Write::Object(o) = w {
                        done.insert((str_at(o, "/metadata/namespace").into(), str_at(o, "/metadata/name").into()));
                    }
                }
                Err(e) => {
                    failed = true;
                    if let Write::Object(o) = w {
                        refused.insert((str_at(o, "/metadata/namespace").into(), str_at(o, "/metadata/name").into()));
                    }
                    if failing.insert(what.clone()) {
                        let hint = match &e {
                            // RBAC's words; a terminating namespace also answers 403.
                            kube::Error::Api(s) if s.code == 403 && s.message.contains(" cannot ") => {
                                " (the control plane's service account lacks the permission: deploy/kubernetes/control-plane-rbac.yaml)"
                            }
                            _ => "",
                        };
                        tracing::warn!(object = %what, "cannot write it, trying again every {RETRY:?}: {e}{hint}");
                    }
                }
            }
        }
        // A Gateway's rendering counts as applied once all its objects were.
        for gw in objects.iter().filter(|o| o["kind"] == "Gateway") {
            let key = gateway_key(gw);
            if done.contains(&key) && !refused.contains(&key) {
                if let Some(made) = render::objects(gw, &settings.deploy) {
                    applied.insert(key, made);
                }
            }
        }
        applied.retain(|k, _| objects.iter().any(|o| o["kind"] == "Gateway" && gateway_key(o) == *k));
        let until_resync = next_resync.saturating_duration_since(tokio::time::Instant::now());
        let wait = if failed || !conflicts.is_empty() { RETRY.min(until_resync) } else { until_resync };
        tokio::select! {
            _ = mirror.changed.notified() => tokio::time::sleep(SETTLE).await,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests;
