//! `analyze` (istioctl's): problems in the applied configuration that
//! `apply` lets through because each object is valid alone. Istio's
//! message codes where Istio has the check (IST0101, IST0118), ours
//! (SLP...) where it does not. Pure over the agent's API-server view
//! ([`analyze`]); the command prints istioctl's lines.

use crate::common::Ctx;
use serde_json::Value;
use slipstream_testbed::ipc::{Request, Response};
use std::collections::BTreeMap;
use std::time::Duration;

type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Level {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    pub level: Level,
    pub code: &'static str,
    pub name: &'static str,
    /// `Kind namespace/name`.
    pub object: String,
    pub text: String,
}

impl Message {
    /// istioctl's line: `Warning [IST0118] (Service bookinfo/reviews) ...`.
    pub fn line(&self) -> String {
        format!("{:?} [{}] ({}) {}", self.level, self.code, self.object, self.text)
    }
}

fn ns(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or("")
}
fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}
fn labels(o: &Value, at: &str) -> BTreeMap<String, String> {
    o.pointer(at)
        .and_then(|m| m.as_object())
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default()
}
fn selects(selector: &BTreeMap<String, String>, pod_labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
}
fn of<'a>(all: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    all.iter().filter(move |o| o["kind"] == kind)
}

/// A service host as a VirtualService or DestinationRule names it, as
/// `namespace/name` (short names resolve in the object's namespace).
fn host_key(host: &str, in_ns: &str) -> String {
    let mut parts = host.split('.');
    let svc = parts.next().unwrap_or(host);
    let hns = parts.next().filter(|p| *p != "svc").unwrap_or(in_ns);
    format!("{hns}/{svc}")
}

/// The waypoint a service is bound to: its own `istio.io/use-waypoint`,
/// else its namespace's (`none` opts out).
fn waypoint_of(svc: &Value, namespaces: &BTreeMap<String, BTreeMap<String, String>>) -> Option<String> {
    let own = labels(svc, "/metadata/labels");
    let label =
        own.get("istio.io/use-waypoint").cloned().or_else(|| namespaces.get(ns(svc)).and_then(|l| l.get("istio.io/use-waypoint").cloned()));
    label.filter(|w| w != "none" && !w.is_empty())
}

/// What every check reads: the objects, the namespace asked about, the
/// namespaces' labels, the pods and the services.
struct View<'a> {
    all: &'a [Value],
    only: Option<&'a str>,
    namespaces: BTreeMap<String, Labels>,
    pods: Vec<&'a Value>,
    services: Vec<&'a Value>,
}

impl<'a> View<'a> {
    fn new(all: &'a [Value], only: Option<&'a str>) -> Self {
        let namespaces = of(all, "Namespace").map(|n| (name(n).to_string(), labels(n, "/metadata/labels"))).collect();
        View { all, only, namespaces, pods: of(all, "Pod").collect(), services: of(all, "Service").collect() }
    }

    /// In the namespace asked about (or any, when none is).
    fn in_scope(&self, o: &Value) -> bool {
        self.only.is_none_or(|n| ns(o) == n)
    }
}

/// The problems of the configuration `all` (every object, as `get -o json`
/// gives them), in namespace `only` or everywhere.
pub fn analyze(all: &[Value], only: Option<&str>) -> Vec<Message> {
    let v = View::new(all, only);
    let mut out = Vec::new();
    port_names(&v, &mut out);
    subsets(&v, &mut out);
    unused_waypoints(&v, &mut out);
    l7_without_waypoint(&v, &mut out);
    out.sort_by(|a, b| b.level.cmp(&a.level).then(a.object.cmp(&b.object)));
    out
}

/// IST0118: ports a waypoint cannot tell the protocol of.
fn port_names(v: &View, out: &mut Vec<Message>) {
    let (namespaces, services) = (&v.namespaces, &v.services);
    let in_scope = |o: &Value| v.in_scope(o);
    // IST0118: a service whose traffic a waypoint routes, with a port whose
    // protocol neither its name nor appProtocol says.
    const PREFIXES: &[&str] = &["http", "http2", "https", "grpc", "grpc-web", "tcp", "tls", "mongo", "mysql", "redis", "udp"];
    for s in services.iter().filter(|s| in_scope(s)) {
        if waypoint_of(s, namespaces).is_none() || name(s) == "waypoint" {
            continue;
        }
        for p in s["spec"]["ports"].as_array().into_iter().flatten() {
            let pname = p["name"].as_str().unwrap_or("");
            let proto = pname.split('-').next().unwrap_or("");
            if p["appProtocol"].is_string() || PREFIXES.contains(&proto) {
                continue;
            }
            out.push(Message {
                level: Level::Info,
                code: "IST0118",
                name: "PortNameIsNotUnderNamingConvention",
                object: format!("Service {}/{}", ns(s), name(s)),
                text: format!(
                    "Port name {} (port: {}, targetPort: {}) doesn't follow the naming convention of Istio port: its waypoint detects the protocol from the first bytes instead (name it http-..., or set appProtocol)",
                    if pname.is_empty() { "<none>" } else { pname },
                    p["port"],
                    p["targetPort"]
                ),
            });
        }
    }
}

/// IST0101 / SLP0002: subsets no DestinationRule defines, or that select no pod.
fn subsets(v: &View, out: &mut Vec<Message>) {
    let (all, pods, services) = (v.all, &v.pods, &v.services);
    let in_scope = |o: &Value| v.in_scope(o);
    // IST0101 / SLP0002: VirtualService destinations whose subset no
    // DestinationRule defines, or defines with labels no pod has.
    let mut subsets: BTreeMap<String, Vec<(String, Labels)>> = BTreeMap::new();
    for dr in of(all, "DestinationRule") {
        let host = host_key(dr["spec"]["host"].as_str().unwrap_or(""), ns(dr));
        for s in dr["spec"]["subsets"].as_array().into_iter().flatten() {
            let labels: BTreeMap<String, String> = s["labels"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                .unwrap_or_default();
            subsets.entry(host.clone()).or_default().push((s["name"].as_str().unwrap_or("").to_string(), labels));
        }
    }
    for vs in of(all, "VirtualService").filter(|v| in_scope(v)) {
        let obj = format!("VirtualService {}/{}", ns(vs), name(vs));
        for route in vs["spec"]["http"].as_array().into_iter().flatten() {
            for d in route["route"].as_array().into_iter().flatten() {
                let Some(subset) = d["destination"]["subset"].as_str() else { continue };
                let host = host_key(d["destination"]["host"].as_str().unwrap_or(""), ns(vs));
                match subsets.get(&host).and_then(|v| v.iter().find(|(n, _)| n == subset)) {
                    None => out.push(Message {
                        level: Level::Error,
                        code: "IST0101",
                        name: "ReferencedResourceNotFound",
                        object: obj.clone(),
                        text: format!("Referenced host+subset in destinationrule not found: \"{host}+{subset}\""),
                    }),
                    Some((_, sel)) => {
                        let (hns, hname) = host.split_once('/').unwrap_or(("", ""));
                        let svc_sel = services
                            .iter()
                            .find(|s| ns(s) == hns && name(s) == hname)
                            .map(|s| labels(s, "/spec/selector"))
                            .unwrap_or_default();
                        let any = pods.iter().any(|p| {
                            let pl = labels(p, "/metadata/labels");
                            ns(p) == hns && selects(&svc_sel, &pl) && selects(sel, &pl)
                        });
                        if !any {
                            out.push(Message {
                                level: Level::Warning,
                                code: "SLP0002",
                                name: "SubsetSelectsNoPods",
                                object: obj.clone(),
                                text: format!("subset {subset} of {host} selects no pod of the service (labels {sel:?}): its share of requests is answered 503"),
                            });
                        }
                    }
                }
            }
        }
    }
}

/// SLP0003: waypoints nothing is bound to.
fn unused_waypoints(v: &View, out: &mut Vec<Message>) {
    let (all, namespaces, pods, services) = (v.all, &v.namespaces, &v.pods, &v.services);
    let in_scope = |o: &Value| v.in_scope(o);
    // SLP0003: a waypoint that nothing is bound to.
    for gw in of(all, "Gateway").filter(|g| in_scope(g) && g["spec"]["gatewayClassName"] == "istio-waypoint") {
        let wname = name(gw);
        let gns = ns(gw);
        let bound_ns = namespaces.get(gns).and_then(|l| l.get("istio.io/use-waypoint")).map(String::as_str) == Some(wname);
        let bound_svc = services
            .iter()
            .any(|s| ns(s) == gns && labels(s, "/metadata/labels").get("istio.io/use-waypoint").map(String::as_str) == Some(wname));
        let bound_pod = pods
            .iter()
            .any(|p| ns(p) == gns && labels(p, "/metadata/labels").get("istio.io/use-waypoint").map(String::as_str) == Some(wname));
        let other_ns = namespaces.values().any(|l| l.get("istio.io/use-waypoint-namespace").map(String::as_str) == Some(gns));
        if !(bound_ns || bound_svc || bound_pod || other_ns) {
            out.push(Message {
                level: Level::Info,
                code: "SLP0003",
                name: "WaypointUnused",
                object: format!("Gateway {gns}/{wname}"),
                text: format!("no namespace, service or pod is bound to this waypoint (label one istio.io/use-waypoint={wname})"),
            });
        }
    }
}

/// SLP0001: L7 rules on pods no waypoint serves.
fn l7_without_waypoint(v: &View, out: &mut Vec<Message>) {
    let (all, namespaces, pods, services) = (v.all, &v.namespaces, &v.pods, &v.services);
    let in_scope = |o: &Value| v.in_scope(o);
    // SLP0001: a selector (or namespace-wide) AuthorizationPolicy with L7
    // rules on pods that no waypoint serves: the node proxies enforce it
    // with the L4 fail-safe meaning.
    for ap in of(all, "AuthorizationPolicy").filter(|a| in_scope(a)) {
        if ap["spec"]["targetRefs"].is_array() || ap["spec"]["targetRef"].is_object() {
            continue;
        }
        let l7 =
            ap["spec"]["rules"].as_array().into_iter().flatten().any(|r| {
                r["to"].as_array().into_iter().flatten().any(|t| {
                    ["methods", "paths", "hosts", "notMethods", "notPaths", "notHosts"].iter().any(|f| t["operation"][f].is_array())
                }) || r["when"].as_array().into_iter().flatten().any(|w| w["key"].as_str().is_some_and(|k| k.starts_with("request.")))
            });
        if !l7 {
            continue;
        }
        let sel = labels(ap, "/spec/selector/matchLabels");
        let selected: Vec<&&Value> = pods.iter().filter(|p| ns(p) == ns(ap) && selects(&sel, &labels(p, "/metadata/labels"))).collect();
        let behind_waypoint = |p: &Value| {
            services.iter().any(|s| {
                ns(s) == ns(p) && {
                    let ssel = labels(s, "/spec/selector");
                    !ssel.is_empty() && selects(&ssel, &labels(p, "/metadata/labels")) && waypoint_of(s, namespaces).is_some()
                }
            })
        };
        let bare: Vec<&str> = selected.iter().filter(|p| !behind_waypoint(p)).map(|p| name(p)).collect();
        if !bare.is_empty() {
            out.push(Message {
                level: Level::Warning,
                code: "SLP0001",
                name: "L7PolicyWithoutWaypoint",
                object: format!("AuthorizationPolicy {}/{}", ns(ap), name(ap)),
                text: format!(
                    "has L7 rules (methods, paths, hosts or request conditions) but selects pods no waypoint serves ({}): their node proxies apply the L4 fail-safe meaning (an ALLOW rule with L7 fields matches nothing). Bind their Service to a waypoint (istioctl waypoint apply, label istio.io/use-waypoint)",
                    bare.join(", ")
                ),
            });
        }
    }
}

/// `analyze [-n NS | -A] [-o log|json]`: exit code 79 with an Error, as
/// istioctl's default `--failure-threshold`.
pub fn run(ctx: &Ctx, namespace: Option<&str>, all_namespaces: bool, output: &str) -> anyhow::Result<i32> {
    let items = match ctx.call(&Request::Objects, Duration::from_secs(10))? {
        Response::Objects { items } => items,
        other => anyhow::bail!("unexpected answer from the agent: {other:?}"),
    };
    let only = if all_namespaces { None } else { Some(namespace.unwrap_or("default")) };
    let msgs = analyze(&items, only);
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&msgs)?),
        _ if msgs.is_empty() => match only {
            Some(n) => println!("\u{2714} No validation issues found when analyzing namespace: {n}."),
            None => println!("\u{2714} No validation issues found when analyzing all namespaces."),
        },
        _ => msgs.iter().for_each(|m| println!("{}", m.line())),
    }
    Ok(if msgs.iter().any(|m| m.level == Level::Error) { 79 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn world() -> Vec<Value> {
        vec![
            json!({"kind": "Namespace", "metadata": {"name": "bookinfo", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
            json!({"kind": "Pod", "metadata": {"name": "reviews-v1-x", "namespace": "bookinfo", "labels": {"app": "reviews", "version": "v1"}}}),
            json!({"kind": "Pod", "metadata": {"name": "billing-x", "namespace": "bookinfo", "labels": {"app": "billing"}}}),
            json!({"kind": "Service", "metadata": {"name": "reviews", "namespace": "bookinfo", "labels": {"istio.io/use-waypoint": "waypoint"}},
                   "spec": {"selector": {"app": "reviews"}, "ports": [{"name": "web", "port": 9080, "targetPort": 9080}]}}),
            json!({"kind": "Service", "metadata": {"name": "billing", "namespace": "bookinfo"},
                   "spec": {"selector": {"app": "billing"}, "ports": [{"port": 8080, "targetPort": 8080}]}}),
            json!({"kind": "Gateway", "metadata": {"name": "waypoint", "namespace": "bookinfo"}, "spec": {"gatewayClassName": "istio-waypoint"}}),
            json!({"kind": "Gateway", "metadata": {"name": "idle", "namespace": "bookinfo"}, "spec": {"gatewayClassName": "istio-waypoint"}}),
            json!({"kind": "DestinationRule", "metadata": {"name": "reviews", "namespace": "bookinfo"},
                   "spec": {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}}),
            json!({"kind": "VirtualService", "metadata": {"name": "reviews", "namespace": "bookinfo"},
                   "spec": {"hosts": ["reviews"], "http": [{"route": [
                       {"destination": {"host": "reviews", "subset": "v1"}, "weight": 50},
                       {"destination": {"host": "reviews", "subset": "v2"}, "weight": 25},
                       {"destination": {"host": "reviews.bookinfo.svc.cluster.local", "subset": "v9"}, "weight": 25}]}]}}),
            json!({"kind": "AuthorizationPolicy", "metadata": {"name": "billing-get", "namespace": "bookinfo"},
                   "spec": {"selector": {"matchLabels": {"app": "billing"}}, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}}),
            json!({"kind": "AuthorizationPolicy", "metadata": {"name": "reviews-get", "namespace": "bookinfo"},
                   "spec": {"selector": {"matchLabels": {"app": "reviews"}}, "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}]}}),
        ]
    }

    #[test]
    fn each_check_names_the_object_and_code() {
        let msgs = analyze(&world(), Some("bookinfo"));
        let codes: Vec<(&str, &str)> = msgs.iter().map(|m| (m.code, m.object.as_str())).collect();
        assert_eq!(
            codes,
            [
                ("IST0101", "VirtualService bookinfo/reviews"),
                ("SLP0001", "AuthorizationPolicy bookinfo/billing-get"),
                ("SLP0002", "VirtualService bookinfo/reviews"),
                ("SLP0003", "Gateway bookinfo/idle"),
                ("IST0118", "Service bookinfo/reviews"),
            ],
            "{msgs:#?}"
        );
        assert!(
            msgs[0].line().starts_with("Error [IST0101] (VirtualService bookinfo/reviews) Referenced host+subset"),
            "{}",
            msgs[0].line()
        );
        assert!(msgs[2].text.contains("subset v2"), "v2 selects no pod: {}", msgs[2].text);
        // Another namespace: nothing.
        assert!(analyze(&world(), Some("default")).is_empty());
    }
}
