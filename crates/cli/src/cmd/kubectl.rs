//! kubectl's verbs on the local cluster, with kubectl's flags, words and
//! exit codes (issue 17): `get`, `describe`, `label`, `annotate`,
//! `create namespace`, `wait`, and `delete KIND NAME`. What they read is
//! the agent's API-server view of its objects (`Request::Objects`: the
//! objects as Kubernetes would serve them, with `apiVersion` and `kind`);
//! what they change goes through the agent's checks like an `apply`.
//! Parsing and formatting are pure and table-tested.

use crate::common::{self, Ctx};
use anyhow::bail;
use serde_json::Value;
use slipstream_testbed::ipc::{Request, Response};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A kind as kubectl names it: its aliases, its name in `-o name` output
/// and whether it lives in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub kind: &'static str,
    /// `-o name` and message prefix: `pod`, `deployment.apps`, `gateway.gateway.networking.k8s.io`.
    pub resource: &'static str,
    /// kubectl's plural, in `pods "x" not found`.
    pub plural: &'static str,
    pub namespaced: bool,
    aliases: &'static [&'static str],
}

const KINDS: &[Kind] = &[
    Kind { kind: "Pod", resource: "pod", plural: "pods", namespaced: true, aliases: &["po", "pod", "pods"] },
    Kind { kind: "Service", resource: "service", plural: "services", namespaced: true, aliases: &["svc", "service", "services"] },
    Kind {
        kind: "Deployment",
        resource: "deployment.apps",
        plural: "deployments.apps",
        namespaced: true,
        aliases: &["deploy", "deployment", "deployments"],
    },
    Kind { kind: "Namespace", resource: "namespace", plural: "namespaces", namespaced: false, aliases: &["ns", "namespace", "namespaces"] },
    Kind {
        kind: "ServiceAccount",
        resource: "serviceaccount",
        plural: "serviceaccounts",
        namespaced: true,
        aliases: &["sa", "serviceaccount", "serviceaccounts"],
    },
    Kind { kind: "ConfigMap", resource: "configmap", plural: "configmaps", namespaced: true, aliases: &["cm", "configmap", "configmaps"] },
    Kind {
        kind: "Gateway",
        resource: "gateway.gateway.networking.k8s.io",
        plural: "gateways.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["gtw", "gateway", "gateways"],
    },
    Kind {
        kind: "HTTPRoute",
        resource: "httproute.gateway.networking.k8s.io",
        plural: "httproutes.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["httproute", "httproutes"],
    },
    Kind {
        kind: "GRPCRoute",
        resource: "grpcroute.gateway.networking.k8s.io",
        plural: "grpcroutes.gateway.networking.k8s.io",
        namespaced: true,
        aliases: &["grpcroute", "grpcroutes"],
    },
    Kind {
        kind: "AuthorizationPolicy",
        resource: "authorizationpolicy.security.istio.io",
        plural: "authorizationpolicies.security.istio.io",
        namespaced: true,
        aliases: &["ap", "authorizationpolicy", "authorizationpolicies"],
    },
    Kind {
        kind: "PeerAuthentication",
        resource: "peerauthentication.security.istio.io",
        plural: "peerauthentications.security.istio.io",
        namespaced: true,
        aliases: &["pa", "peerauthentication", "peerauthentications"],
    },
    Kind {
        kind: "RequestAuthentication",
        resource: "requestauthentication.security.istio.io",
        plural: "requestauthentications.security.istio.io",
        namespaced: true,
        aliases: &["ra", "requestauthentication", "requestauthentications"],
    },
    Kind {
        kind: "VirtualService",
        resource: "virtualservice.networking.istio.io",
        plural: "virtualservices.networking.istio.io",
        namespaced: true,
        aliases: &["vs", "virtualservice", "virtualservices"],
    },
    Kind {
        kind: "DestinationRule",
        resource: "destinationrule.networking.istio.io",
        plural: "destinationrules.networking.istio.io",
        namespaced: true,
        aliases: &["dr", "destinationrule", "destinationrules"],
    },
    Kind {
        kind: "NetworkPolicy",
        resource: "networkpolicy.networking.k8s.io",
        plural: "networkpolicies.networking.k8s.io",
        namespaced: true,
        aliases: &["netpol", "networkpolicy", "networkpolicies"],
    },
    Kind {
        kind: "CiliumNetworkPolicy",
        resource: "ciliumnetworkpolicy.cilium.io",
        plural: "ciliumnetworkpolicies.cilium.io",
        namespaced: true,
        aliases: &["cnp", "ciliumnetworkpolicy", "ciliumnetworkpolicies"],
    },
    Kind {
        kind: "LocalRateLimitPolicy",
        resource: "localratelimitpolicy.slipstream.io",
        plural: "localratelimitpolicies.slipstream.io",
        namespaced: true,
        aliases: &["localratelimitpolicy", "localratelimitpolicies"],
    },
];

/// A kind by any of kubectl's names for it (`po`, `pods`, `deployments.apps`,
/// `gateway.gateway.networking.k8s.io`, `Gateway`).
pub fn kind(name: &str) -> Result<Kind, String> {
    let lower = name.to_ascii_lowercase();
    let short = lower.split('.').next().unwrap_or(&lower);
    KINDS
        .iter()
        .find(|k| {
            k.aliases.contains(&lower.as_str())
                || k.kind.eq_ignore_ascii_case(&lower)
                || lower == k.resource
                || lower == k.plural
                || (lower.contains('.') && k.aliases.contains(&short) && (k.resource.ends_with(&lower[short.len()..])))
        })
        .copied()
        .ok_or_else(|| format!("the server doesn't have a resource type \"{name}\""))
}

/// What `get`, `describe`, `wait` and `delete` were asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub kind: Kind,
    /// Empty: every object of the kind.
    pub names: Vec<String>,
}

/// kubectl's argument forms: `KIND[,KIND...] [NAME...]` or `KIND/NAME ...`;
/// `all` is pods, services and deployments.
pub fn wanted(args: &[String]) -> Result<Vec<Wanted>, String> {
    let Some(first) = args.first() else { return Err("you must specify the type of resource to get".into()) };
    if first.contains('/') {
        let mut out: Vec<Wanted> = Vec::new();
        for a in args {
            let (k, n) = a.split_once('/').ok_or_else(|| format!("there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {a:?})"))?;
            if n.is_empty() {
                return Err(format!("{a:?}: no name after the type"));
            }
            let k = kind(k)?;
            match out.iter_mut().find(|w| w.kind == k) {
                Some(w) => w.names.push(n.to_string()),
                None => out.push(Wanted { kind: k, names: vec![n.to_string()] }),
            }
        }
        return Ok(out);
    }
    let names: Vec<String> = args[1..].to_vec();
    if names.iter().any(|n| n.contains('/')) {
        return Err(
            "there is no need to specify a resource type as a separate argument when passing arguments in resource/name form".into()
        );
    }
    let mut out = Vec::new();
    for k in first.split(',') {
        if k == "all" {
            for k in ["Pod", "Service", "Deployment"] {
                out.push(Wanted { kind: kind(k)?, names: names.clone() });
            }
        } else {
            out.push(Wanted { kind: kind(k)?, names: names.clone() });
        }
    }
    Ok(out)
}

/// A label selector of kubectl's equality forms: `k=v`, `k==v`, `k!=v`,
/// `k` (exists), `!k` (absent), comma-separated (all must hold).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<(String, Req)>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String),
    Ne(String),
    Exists,
    Absent,
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let r = if let Some((k, v)) = part.split_once("!=") {
                (k.trim().to_string(), Req::Ne(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k.trim().to_string(), Req::Eq(v.trim().to_string()))
            } else if let Some(k) = part.strip_prefix('!') {
                (k.trim().to_string(), Req::Absent)
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!(
                    "unable to parse requirement {part:?}: set-based selectors (in, notin) are not supported; use k=v, k!=v, k or !k"
                ));
            } else {
                (part.to_string(), Req::Exists)
            };
            slipstream_k8s::names::check_label_key(&r.0).map_err(|e| format!("selector {part:?}: {e}"))?;
            out.push(r);
        }
        Ok(Selector(out))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(k, r)| match r {
            Req::Eq(v) => labels.get(k) == Some(v),
            Req::Ne(v) => labels.get(k) != Some(v),
            Req::Exists => labels.contains_key(k),
            Req::Absent => !labels.contains_key(k),
        })
    }
}

/// `key=value` sets, `key-` removes (label and annotate).
pub fn changes(args: &[String]) -> Result<Vec<(String, Option<String>)>, String> {
    if args.is_empty() {
        return Err("at least one label update is required".into());
    }
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), Some(v.to_string()))),
            None if a.ends_with('-') && a.len() > 1 => Ok((a[..a.len() - 1].to_string(), None)),
            _ => Err(format!("invalid label spec: {a:?} (use key=value to set, key- to remove)")),
        })
        .collect()
}

fn labels_of(o: &Value) -> BTreeMap<String, String> {
    o["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default()
}

fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

fn namespace_of(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or("")
}

/// Where to look: one namespace, or all (`-A`).
#[derive(Debug, Clone)]
pub struct Scope {
    pub namespace: Option<String>,
    pub all: bool,
    pub selector: Selector,
}

impl Scope {
    fn admits(&self, k: &Kind, o: &Value) -> bool {
        (!k.namespaced || self.all || Some(namespace_of(o)) == self.namespace.as_deref().or(Some("default")))
            && self.selector.matches(&labels_of(o))
    }

    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

pub(crate) fn objects(ctx: &Ctx) -> anyhow::Result<Vec<Value>> {
    match ctx.call(&Request::Objects, Duration::from_secs(10))? {
        Response::Objects { items } => Ok(items),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// The objects of `w` in `scope`, or kubectl's NotFound error for a name
/// that does not exist.
pub fn select<'a>(all: &'a [Value], w: &Wanted, scope: &Scope) -> Result<Vec<&'a Value>, String> {
    let of_kind: Vec<&Value> = all.iter().filter(|o| o["kind"] == w.kind.kind && scope.admits(&w.kind, o)).collect();
    if w.names.is_empty() {
        return Ok(of_kind);
    }
    w.names
        .iter()
        .map(|n| {
            of_kind.iter().find(|o| name_of(o) == n).copied().ok_or_else(|| {
                format!("Error from server (NotFound): {} \"{n}\" not found", w.kind.plural.split('.').next().unwrap_or(w.kind.plural))
            })
        })
        .collect()
}

/// One table row of `get`, with the pods' state from `status` (READY,
/// STATUS, RESTARTS as kubectl shows them).
fn row(k: &Kind, o: &Value, st: &slipstream_testbed::status::ClusterStatus, wide: bool) -> Vec<String> {
    let name = name_of(o).to_string();
    match k.kind {
        "Pod" => {
            let p = st.pods.iter().find(|p| p.namespace == namespace_of(o) && p.name == name);
            let ready =
                p.map(|p| format!("{}/{}", p.containers.iter().filter(|c| c.ready).count(), p.containers.len())).unwrap_or("0/0".into());
            let status = p
                .map(|p| if p.reason.is_empty() || p.ready { format!("{:?}", p.phase) } else { p.reason.clone() })
                .unwrap_or_else(|| o["status"]["phase"].as_str().unwrap_or("Unknown").to_string());
            let restarts = p.map(|p| p.restarts.to_string()).unwrap_or("0".into());
            let mut r = vec![name, ready, status, restarts];
            if wide {
                r.push(o["status"]["podIP"].as_str().unwrap_or("<none>").to_string());
                r.push(o["spec"]["nodeName"].as_str().unwrap_or("<none>").to_string());
            }
            r
        }
        "Service" => {
            let ports: Vec<String> = o["spec"]["ports"]
                .as_array()
                .map(|ps| ps.iter().map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"))).collect())
                .unwrap_or_default();
            let mut r = vec![
                name,
                o["spec"]["type"].as_str().unwrap_or("ClusterIP").to_string(),
                o["spec"]["clusterIP"].as_str().unwrap_or("<none>").to_string(),
                "<none>".into(),
                if ports.is_empty() { "<none>".into() } else { ports.join(",") },
            ];
            if wide {
                let sel: Vec<String> = o["spec"]["selector"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
                    .unwrap_or_default();
                r.push(if sel.is_empty() { "<none>".into() } else { sel.join(",") });
            }
            r
        }
        "Deployment" => {
            let s = &o["status"];
            vec![
                name,
                format!("{}/{}", s["readyReplicas"].as_u64().unwrap_or(0), o["spec"]["replicas"].as_u64().unwrap_or(0)),
                s["updatedReplicas"].as_u64().unwrap_or(0).to_string(),
                s["availableReplicas"].as_u64().unwrap_or(0).to_string(),
            ]
        }
        "Namespace" => vec![name, "Active".into()],
        "Gateway" => vec![
            name,
            o["spec"]["gatewayClassName"].as_str().unwrap_or("").to_string(),
            o["status"]["addresses"][0]["value"].as_str().unwrap_or("").to_string(),
            // kubectl's column: the Programmed condition, Unknown when no
            // controller wrote one (a class other than istio-waypoint).
            status_condition(o, "Programmed").map_or("Unknown", |c| if c { "True" } else { "False" }).to_string(),
        ],
        _ => vec![name],
    }
}

fn header(k: &Kind, wide: bool) -> Vec<&'static str> {
    let mut h = match k.kind {
        "Pod" => vec!["NAME", "READY", "STATUS", "RESTARTS"],
        "Service" => vec!["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"],
        "Deployment" => vec!["NAME", "READY", "UP-TO-DATE", "AVAILABLE"],
        "Namespace" => vec!["NAME", "STATUS"],
        "Gateway" => vec!["NAME", "CLASS", "ADDRESS", "PROGRAMMED"],
        _ => vec!["NAME"],
    };
    if wide {
        match k.kind {
            "Pod" => h.extend(["IP", "NODE"]),
            "Service" => h.push("SELECTOR"),
            _ => {}
        }
    }
    h
}

/// Columns padded as kubectl pads them (three spaces between).
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols).map(|i| rows.iter().filter_map(|r| r.get(i)).map(String::len).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i + 1 == r.len() {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<w$}   ", w = widths[i]));
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub struct GetArgs<'a> {
    pub resources: &'a [String],
    pub scope: Scope,
    pub output: Option<&'a str>,
    pub watch: bool,
}

pub fn get(ctx: &Ctx, a: GetArgs) -> anyhow::Result<()> {
    let wanted = wanted(a.resources).map_err(anyhow::Error::msg)?;
    let output = a.output.unwrap_or("");
    if !["", "wide", "json", "yaml", "name"].contains(&output) {
        bail!("unable to match a printer suitable for the output format {output:?}, allowed formats are: json, name, wide, yaml");
    }
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut first = true;
    loop {
        let all = objects(ctx)?;
        let st = ctx.status()?;
        let mut found: Vec<(Kind, &Value)> = Vec::new();
        for w in &wanted {
            match select(&all, w, &a.scope) {
                Ok(v) => found.extend(v.into_iter().map(|o| (w.kind, o))),
                Err(e) => bail!("{e}"),
            }
        }
        let single = wanted.len() == 1 && wanted[0].names.len() == 1;
        match output {
            "json" | "yaml" => {
                let items: Vec<Value> = found.iter().map(|(_, o)| (*o).clone()).collect();
                let v = if single {
                    items.into_iter().next().unwrap_or_default()
                } else {
                    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
                };
                if output == "json" {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    print!("{}", serde_yaml::to_string(&v)?);
                }
            }
            "name" => {
                for (k, o) in &found {
                    println!("{}/{}", k.resource, name_of(o));
                }
            }
            _ => {
                let wide = output == "wide";
                if found.is_empty() && first {
                    match (&a.scope.all, wanted.iter().all(|w| w.kind.namespaced)) {
                        (false, true) => eprintln!("No resources found in {} namespace.", a.scope.ns()),
                        _ => eprintln!("No resources found"),
                    }
                }
                // One table per kind, as kubectl prints several kinds.
                let mut blocks = Vec::new();
                for w in &wanted {
                    let mine: Vec<&Value> = found.iter().filter(|(k, _)| *k == w.kind).map(|(_, o)| *o).collect();
                    if mine.is_empty() {
                        continue;
                    }
                    let prefix = wanted.len() > 1;
                    let mut rows = Vec::new();
                    let mut head: Vec<String> = header(&w.kind, wide).into_iter().map(String::from).collect();
                    if a.scope.all && w.kind.namespaced {
                        head.insert(0, "NAMESPACE".into());
                    }
                    rows.push(head);
                    for o in mine {
                        let mut r = row(&w.kind, o, &st, wide);
                        if prefix {
                            r[0] = format!("{}/{}", w.kind.resource, r[0]);
                        }
                        if a.scope.all && w.kind.namespaced {
                            r.insert(0, namespace_of(o).to_string());
                        }
                        let key = format!("{}/{}/{}", w.kind.kind, namespace_of(o), name_of(o));
                        let line = r.join("\u{1}");
                        if !first && shown.get(&key) == Some(&line) {
                            continue;
                        }
                        shown.insert(key, line);
                        rows.push(r);
                    }
                    if first {
                        blocks.push(table(&rows));
                    } else if rows.len() > 1 {
                        // Watching: a changed row, without the header.
                        let t = table(&rows);
                        blocks.push(t.split_once('\n').map(|(_, rows)| rows.to_string()).unwrap_or_default());
                    }
                }
                if !blocks.is_empty() {
                    println!("{}", blocks.join("\n\n"));
                }
            }
        }
        if !a.watch || common::interrupted() {
            return Ok(());
        }
        first = false;
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn describe(ctx: &Ctx, resources: &[String], scope: Scope) -> anyhow::Result<()> {
    let wanted = wanted(resources).map_err(anyhow::Error::msg)?;
    let all = objects(ctx)?;
    let mut out = Vec::new();
    for w in &wanted {
        for o in select(&all, w, &scope).map_err(anyhow::Error::msg)? {
            let kv = |field: &str| {
                o["metadata"][field]
                    .as_object()
                    .filter(|m| !m.is_empty())
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join("\n             "))
                    .unwrap_or_else(|| "<none>".into())
            };
            let mut text = format!("Name:        {}\n", name_of(o));
            if w.kind.namespaced {
                text.push_str(&format!("Namespace:   {}\n", namespace_of(o)));
            }
            text.push_str(&format!("Kind:        {}\nLabels:      {}\nAnnotations: {}\n", w.kind.kind, kv("labels"), kv("annotations")));
            for part in ["spec", "status"] {
                if o[part].is_object() {
                    let y = serde_yaml::to_string(&o[part])?;
                    text.push_str(&format!("{}{}:\n", &part[..1].to_uppercase(), &part[1..]));
                    text.push_str(&y.lines().map(|l| format!("  {l}\n")).collect::<String>());
                }
            }
            text.push_str("Events:      <none>\n");
            out.push(text);
        }
    }
    if out.is_empty() {
        eprintln!("No resources found in {} namespace.", scope.ns());
    }
    print!("{}", out.join("\n\n"));
    Ok(())
}

/// `label` and `annotate`: `KIND NAME k=v k-` or `KIND/NAME k=v`.
pub fn label(ctx: &Ctx, args: &[String], namespace: Option<&str>, overwrite: bool, annotate: bool) -> anyhow::Result<()> {
    common::require_root(if annotate { "annotate" } else { "label" })?;
    let (k, name, rest) = match args {
        [first, rest @ ..] if first.contains('/') => {
            let (k, n) = first.split_once('/').unwrap_or_default();
            (kind(k).map_err(anyhow::Error::msg)?, n.to_string(), rest)
        }
        [k, n, rest @ ..] => (kind(k).map_err(anyhow::Error::msg)?, n.clone(), rest),
        _ => bail!("you must specify a resource, its name and at least one {}", if annotate { "annotation" } else { "label" }),
    };
    let changes = changes(rest).map_err(anyhow::Error::msg)?;
    let ns = if k.namespaced { namespace.unwrap_or("default").to_string() } else { String::new() };
    let req = Request::Label { kind: k.kind.to_string(), namespace: ns, name, changes, overwrite, annotate };
    match ctx.call(&req, Duration::from_secs(30))? {
        Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    // As after an apply: the node proxies hold the change when it returns.
    crate::cmd::proxy_status::wait_acked_quietly(ctx, Duration::from_secs(30))
}

pub fn create_namespace(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    common::require_root("create")?;
    slipstream_k8s::names::check_dns_label(name).map_err(|e| anyhow::anyhow!("The Namespace \"{name}\" is invalid: metadata.name: {e}"))?;
    let all = objects(ctx)?;
    if all.iter().any(|o| o["kind"] == "Namespace" && name_of(o) == name) {
        bail!("Error from server (AlreadyExists): namespaces \"{name}\" already exists");
    }
    let o: slipstream_k8s::Object =
        serde_json::from_value(serde_json::json!({"Namespace": {"metadata": {"name": name}}})).expect("a namespace object");
    match ctx.call(&Request::Apply { objects: vec![o] }, Duration::from_secs(30))? {
        Response::Done { .. } => println!("namespace/{name} created"),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    Ok(())
}

/// `delete KIND NAME...` (or `KIND/NAME`), waiting for their pods to stop
/// as `delete -f` does.
pub fn delete(ctx: &Ctx, resources: &[String], namespace: Option<&str>, ignore_not_found: bool, timeout: Duration) -> anyhow::Result<()> {
    common::require_root("delete")?;
    let wanted = wanted(resources).map_err(anyhow::Error::msg)?;
    if wanted.iter().any(|w| w.names.is_empty()) {
        bail!("resource(s) were provided, but no name was specified (give names, or use -f)");
    }
    let ns = namespace.unwrap_or("default");
    let keys: Vec<slipstream_k8s::ObjectKey> = wanted
        .iter()
        .flat_map(|w| {
            w.names.iter().map(|n| slipstream_k8s::ObjectKey {
                kind: w.kind.kind.to_string(),
                namespace: if w.kind.namespaced { ns.to_string() } else { String::new() },
                name: n.clone(),
            })
        })
        .collect();
    match ctx.call(&Request::Delete { keys: keys.clone(), ignore_not_found }, Duration::from_secs(120))? {
        Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    common::wait_converged(ctx, timeout, true, &common::Scope::Objects(keys))?;
    Ok(())
}

/// What `wait --for` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `condition=NAME[=value]`: Ready (pods), Available (deployments), or
    /// any condition in the object's `status.conditions` (Programmed).
    Condition(String, bool),
    Delete,
}

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

/// The `status.conditions` entry of that type (kubectl compares types
/// without case), as a boolean; None when there is none.
fn status_condition(o: &Value, type_: &str) -> Option<bool> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"].as_str().is_some_and(|t| t.eq_ignore_ascii_case(type_)))
        .map(|c| c["status"] == "True")
}

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

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn kinds_by_any_name() {
        for (name, want) in [
            ("po", "Pod"),
            ("pods", "Pod"),
            ("svc", "Service"),
            ("deploy", "Deployment"),
            ("deployments.apps", "Deployment"),
            ("ns", "Namespace"),
            ("gateway.gateway.networking.k8s.io", "Gateway"),
            ("gtw", "Gateway"),
            ("authorizationpolicies", "AuthorizationPolicy"),
            ("AuthorizationPolicy", "AuthorizationPolicy"),
            ("vs", "VirtualService"),
            ("cnp", "CiliumNetworkPolicy"),
        ] {
            assert_eq!(kind(name).map(|k| k.kind), Ok(want), "{name}");
        }
        assert_eq!(kind("widgets").unwrap_err(), "the server doesn't have a resource type \"widgets\"");
    }

    #[test]
    fn argument_forms() {
        let w = wanted(&s(&["pods"])).unwrap();
        assert_eq!((w.len(), w[0].kind.kind, w[0].names.len()), (1, "Pod", 0));
        let w = wanted(&s(&["pod", "a", "b"])).unwrap();
        assert_eq!(w[0].names, s(&["a", "b"]));
        let w = wanted(&s(&["pods,svc"])).unwrap();
        assert_eq!(w.iter().map(|w| w.kind.kind).collect::<Vec<_>>(), ["Pod", "Service"]);
        let w = wanted(&s(&["pod/a", "svc/b", "pod/c"])).unwrap();
        assert_eq!((w.len(), w[0].names.clone()), (2, s(&["a", "c"])));
        let w = wanted(&s(&["all"])).unwrap();
        assert_eq!(w.len(), 3);
        assert!(wanted(&s(&["pod", "x/y"])).is_err());
        assert!(wanted(&[]).is_err());
    }

    #[test]
    fn selectors() {
        let l: BTreeMap<String, String> = [("app".into(), "web".into()), ("v".into(), "1".into())].into();
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app", true),
            ("!app", false),
            ("!tier", true),
            ("app=web,v=1", true),
            ("app=web,v=2", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(Selector::parse("env in (a,b)").is_err());
    }

    #[test]
    fn label_changes() {
        assert_eq!(
            changes(&s(&["a=b", "c-", "d="])),
            Ok(vec![("a".into(), Some("b".into())), ("c".into(), None), ("d".into(), Some(String::new()))])
        );
        assert!(changes(&s(&["novalue"])).is_err());
        assert!(changes(&[]).is_err());
    }

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
        let k = KINDS.iter().find(|k| k.kind == "Gateway").unwrap();
        let gw = serde_json::json!({"kind": "Gateway", "status": {"conditions": [
            {"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "False"}]}});
        assert!(holds(k, &gw, "accepted", true));
        assert!(holds(k, &gw, "Programmed", false));
        assert!(!holds(k, &gw, "Programmed", true));
        // Absent: holds neither way (kubectl keeps waiting).
        assert!(!holds(k, &gw, "Ready", true) && !holds(k, &gw, "Ready", false));
        assert_eq!(status_condition(&gw, "programmed"), Some(false));
    }

    #[test]
    fn tables_are_padded_as_kubectl_pads_them() {
        let t = table(&[s(&["NAME", "READY"]), s(&["a-long-name", "1/1"])]);
        assert_eq!(t, "NAME          READY\na-long-name   1/1");
    }
}
