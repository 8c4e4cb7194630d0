//! Per-object validation: the rules Kubernetes' API server applies to the
//! fields we use, plus the local cluster's own (a container must say what to
//! run, because no image is pulled). Cross-object rules (namespace exists,
//! node exists, cluster IP free) live where the whole cluster is known.

use crate::names::*;
use crate::objects::*;
use std::collections::BTreeSet;

pub use crate::error::FieldError;

/// Longest Deployment name whose generated pod names (`name-<10>-<5>`) still
/// fit a 63-character host name.
pub const MAX_DEPLOYMENT_NAME: usize = 63 - 17;

struct Checker {
    errors: Vec<FieldError>,
    warnings: Vec<String>,
}

impl Checker {
    fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), message: message.into() });
    }
    fn check(&mut self, field: impl Into<String>, r: Result<(), String>) {
        if let Err(m) = r {
            self.err(field, m);
        }
    }
}

/// Validates one object. Ok carries warnings (fields accepted but ignored).
pub fn validate(o: &Object) -> Result<Vec<String>, Vec<FieldError>> {
    let mut c = Checker { errors: Vec::new(), warnings: Vec::new() };
    let meta = o.metadata();
    if meta.name.is_empty() {
        c.err("metadata.name", "required");
    } else {
        match o {
            Object::Namespace(_) | Object::Service(_) => c.check("metadata.name", check_dns_label(&meta.name)),
            Object::Deployment(_) => {
                c.check("metadata.name", check_dns_label(&meta.name));
                if meta.name.len() > MAX_DEPLOYMENT_NAME {
                    c.err("metadata.name", format!("at most {MAX_DEPLOYMENT_NAME} characters, so that its pods' names fit 63"));
                }
            }
            Object::Pod(_) => {
                // Pod names become host names: a single DNS label.
                c.check("metadata.name", check_dns_label(&meta.name))
            }
            _ => c.check("metadata.name", check_dns_subdomain(&meta.name)),
        }
    }
    if !o.is_cluster_scoped() {
        c.check("metadata.namespace", check_dns_label(&meta.namespace));
    }
    check_labels(&mut c, "metadata.labels", &meta.labels);

    match o {
        Object::Pod(p) => {
            check_pod_spec(&mut c, "spec", &p.spec, false);
        }
        Object::Deployment(d) => check_deployment(&mut c, d),
        Object::Service(s) => check_service(&mut c, s),
        Object::Kept(k) if k.kind == "PeerAuthentication" => {
            if let Err(es) = crate::istio::peer_authentication(k) {
                c.errors.extend(es);
            }
        }
        Object::Namespace(_) | Object::ServiceAccount(_) | Object::Kept(_) => {}
    }
    if c.errors.is_empty() {
        Ok(c.warnings)
    } else {
        Err(c.errors)
    }
}

fn check_labels(c: &mut Checker, field: &str, labels: &Labels) {
    for (k, v) in labels {
        c.check(format!("{field}[{k}]"), check_label_key(k));
        c.check(format!("{field}[{k}]"), check_label_value(v));
    }
}

fn check_pod_spec(c: &mut Checker, f: &str, spec: &PodSpec, in_deployment: bool) {
    if spec.containers.is_empty() {
        c.err(format!("{f}.containers"), "at least one container is required");
    }
    let mut names = BTreeSet::new();
    for (i, ct) in spec.containers.iter().enumerate() {
        let cf = format!("{f}.containers[{i}]");
        if ct.name.is_empty() {
            c.err(format!("{cf}.name"), "required");
        } else {
            c.check(format!("{cf}.name"), check_dns_label(&ct.name));
            if !names.insert(ct.name.clone()) {
                c.err(format!("{cf}.name"), format!("duplicate container name {}", shown(&ct.name)));
            }
        }
        check_container(c, &cf, ct);
        c.errors.extend(crate::security::check_container(f, &cf, spec.security_context.as_ref(), ct));
    }
    if let Some(sc) = &spec.security_context {
        c.errors.extend(crate::security::check_pod(f, sc));
    }
    if let Some(sa) = spec.service_account_name.as_deref().filter(|s| !s.is_empty()) {
        c.check(format!("{f}.serviceAccountName"), check_dns_subdomain(sa));
    }
    if let Some(n) = &spec.node_name {
        c.check(format!("{f}.nodeName"), check_dns_subdomain(n));
    }
    if in_deployment && spec.restart_policy.is_some_and(|r| r != RestartPolicy::Always) {
        c.err(format!("{f}.restartPolicy"), "a Deployment's pods must use Always");
    }
    if spec.host_network == Some(true) {
        c.err(format!("{f}.hostNetwork"), "not supported by the local cluster (every pod has its own network namespace)");
    }
    if spec.init_containers.is_some() {
        c.warnings.push(format!("{f}.initContainers: ignored by the local cluster"));
    }
    if spec.volumes.is_some() {
        c.warnings.push(format!("{f}.volumes: ignored by the local cluster (no volumes are mounted)"));
    }
}

fn check_container(c: &mut Checker, cf: &str, ct: &Container) {
    if ct.command.is_empty() && ct.image.as_deref().and_then(|i| crate::images::builtin(i, &ct.args)).is_none() {
        let image = ct.image.as_deref().unwrap_or("(none)");
        c.err(
            format!("{cf}.command"),
            format!(
                "required: the local cluster runs the command as a process and pulls no image, \
                 so it cannot know the entrypoint of image {image}; images it runs without a command \
                 (docs/images.md): {}",
                crate::images::KNOWN
            ),
        );
    } else if !ct.command.is_empty() && ct.command[0].is_empty() {
        c.err(format!("{cf}.command[0]"), "must not be empty");
    }
    let mut env_names = BTreeSet::new();
    for (j, e) in ct.env.iter().enumerate() {
        let ef = format!("{cf}.env[{j}]");
        if e.name.is_empty() || e.name.contains('=') || e.name.contains('\0') {
            c.err(format!("{ef}.name"), "must be a non-empty name without '=' or NUL");
        }
        env_names.insert(e.name.clone());
        match (&e.value, &e.value_from) {
            (Some(_), Some(_)) => c.err(&ef, "value and valueFrom are exclusive"),
            (_, Some(src)) => match &src.field_ref {
                Some(fr) if SUPPORTED_FIELD_REFS.contains(&fr.field_path.as_str()) => {}
                Some(fr) => c.err(
                    format!("{ef}.valueFrom.fieldRef.fieldPath"),
                    format!("{} is not supported; supported: {}", shown(&fr.field_path), SUPPORTED_FIELD_REFS.join(", ")),
                ),
                None => c.err(format!("{ef}.valueFrom"), "only fieldRef is supported"),
            },
            _ => {}
        }
    }
    let mut port_names = BTreeSet::new();
    for (j, p) in ct.ports.iter().enumerate() {
        let pf = format!("{cf}.ports[{j}]");
        check_port(c, &format!("{pf}.containerPort"), p.container_port);
        if let Some(n) = &p.name {
            c.check(format!("{pf}.name"), check_port_name(n));
            if !port_names.insert(n.clone()) {
                c.err(format!("{pf}.name"), format!("duplicate port name {}", shown(n)));
            }
        }
    }
    if let Some(probe) = &ct.readiness_probe {
        let pf = format!("{cf}.readinessProbe");
        let handlers = probe.tcp_socket.is_some() as u8 + probe.http_get.is_some() as u8 + probe.exec.is_some() as u8;
        if handlers != 1 {
            c.err(&pf, "exactly one of tcpSocket, httpGet and exec is required");
        }
        let port =
            probe.tcp_socket.as_ref().map(|t| (&t.port, "tcpSocket.port")).or(probe.http_get.as_ref().map(|h| (&h.port, "httpGet.port")));
        if let Some((port, field)) = port {
            match port {
                IntOrString::Int(i) => check_port(c, &format!("{pf}.{field}"), *i),
                IntOrString::Str(s) if !ct.ports.iter().any(|p| p.name.as_deref() == Some(s.as_str())) => {
                    c.err(format!("{pf}.{field}"), format!("names port {}, which the container does not declare", shown(s)))
                }
                IntOrString::Str(_) => {}
            }
        }
        if let Some(e) = &probe.exec {
            if e.command.is_empty() {
                c.err(format!("{pf}.exec.command"), "required");
            }
        }
        for (v, name) in [
            (probe.initial_delay_seconds, "initialDelaySeconds"),
            (probe.period_seconds, "periodSeconds"),
            (probe.timeout_seconds, "timeoutSeconds"),
            (probe.failure_threshold, "failureThreshold"),
        ] {
            if v.is_some_and(|v| v < 0) {
                c.err(format!("{pf}.{name}"), "must be >= 0");
            }
        }
    }
}

fn check_port(c: &mut Checker, field: &str, p: i64) {
    if !(1..=65535).contains(&p) {
        c.err(field, format!("must be between 1 and 65535 (got {p})"));
    }
}

/// IANA service name: at most 15 characters, a DNS label with a letter.
fn check_port_name(n: &str) -> Result<(), String> {
    check_dns_label(n)?;
    if n.len() > 15 {
        return Err(format!("{} is longer than 15 characters", shown(n)));
    }
    if !n.chars().any(|c| c.is_ascii_lowercase()) {
        return Err(format!("{} must contain a letter", shown(n)));
    }
    Ok(())
}

fn check_deployment(c: &mut Checker, d: &Deployment) {
    let s = &d.spec;
    if s.replicas.is_some_and(|r| r < 0) {
        c.err("spec.replicas", format!("must be >= 0 (got {})", s.replicas.unwrap_or_default()));
    }
    if s.selector.match_labels.is_empty() {
        c.err("spec.selector.matchLabels", "required (apps/v1 Deployments need a selector)");
    }
    if !s.selector.match_expressions.is_empty() {
        c.err("spec.selector.matchExpressions", "not supported; use matchLabels");
    }
    check_labels(c, "spec.selector.matchLabels", &s.selector.match_labels);
    check_labels(c, "spec.template.metadata.labels", &s.template.metadata.labels);
    for (k, v) in &s.selector.match_labels {
        if s.template.metadata.labels.get(k) != Some(v) {
            c.err("spec.template.metadata.labels", format!("selector does not match template labels: needs {k}={v}"));
        }
    }
    check_pod_spec(c, "spec.template.spec", &s.template.spec, true);
}

fn check_service(c: &mut Checker, s: &Service) {
    let spec = &s.spec;
    match spec.type_.as_deref() {
        None | Some("ClusterIP") => {}
        Some("NodePort") | Some("LoadBalancer") => {
            c.warnings.push(format!("spec.type: {} is served as ClusterIP by the local cluster", spec.type_.as_deref().unwrap_or("")))
        }
        Some(t) => c.err("spec.type", format!("{t} is not supported (ClusterIP, NodePort and LoadBalancer are)")),
    }
    if let Some(ip) = spec.cluster_ip.as_deref() {
        if !ip.is_empty() && ip != "None" && ip.parse::<std::net::Ipv4Addr>().is_err() {
            c.err("spec.clusterIP", format!("{} is neither an IPv4 address nor \"None\"", shown(ip)));
        }
    }
    if spec.ports.is_empty() && !spec.is_headless() {
        c.err("spec.ports", "at least one port is required");
    }
    if let Some(sel) = &spec.selector {
        check_labels(c, "spec.selector", sel);
    }
    let mut names = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let pf = format!("spec.ports[{i}]");
        check_port(c, &format!("{pf}.port"), p.port);
        if p.protocol == Protocol::SCTP {
            c.err(format!("{pf}.protocol"), "SCTP is not supported (TCP and UDP are)");
        }
        if !seen.insert((p.port, p.protocol)) {
            c.err(format!("{pf}.port"), format!("duplicate port {}/{}", p.port, p.protocol));
        }
        match &p.name {
            Some(n) => {
                c.check(format!("{pf}.name"), check_dns_label(n));
                if !names.insert(n.clone()) {
                    c.err(format!("{pf}.name"), format!("duplicate port name {}", shown(n)));
                }
            }
            None if spec.ports.len() > 1 => c.err(format!("{pf}.name"), "required when a service has several ports"),
            None => {}
        }
        match &p.target_port {
            Some(IntOrString::Int(t)) => check_port(c, &format!("{pf}.targetPort"), *t),
            Some(IntOrString::Str(n)) => c.check(format!("{pf}.targetPort"), check_port_name(n)),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::load::{load_str, Source};

    fn errs(yaml: &str) -> String {
        load_str(yaml, &Source("t.yaml".into())).unwrap_err().to_string()
    }

    const DEPLOY: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo, version: v1}}
    spec:
      serviceAccountName: echo
      containers:
      - name: echo
        command: [slipstream, app, echo]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {tcpSocket: {port: http}}
"#;

    #[test]
    fn good_deployment_loads() {
        let v = load_str(DEPLOY, &Source("t.yaml".into())).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].object.key().to_string(), "Deployment demo/echo");
    }

    #[test]
    fn missing_command_names_the_field_and_image() {
        let y = DEPLOY.replace("command: [slipstream, app, echo]", "image: nginx");
        let e = errs(&y);
        assert!(e.contains("t.yaml: Deployment demo/echo: spec.template.spec.containers[0].command: required"), "{e}");
        assert!(e.contains("image nginx"), "{e}");
    }

    #[test]
    fn type_errors_carry_the_path() {
        let e = errs(&DEPLOY.replace("replicas: 2", "replicas: two"));
        assert!(e.contains("Deployment demo/echo: spec.replicas: invalid type"), "{e}");
    }

    #[test]
    fn selector_must_match_template() {
        let e = errs(&DEPLOY.replace("matchLabels: {app: echo}", "matchLabels: {app: other}"));
        assert!(e.contains("spec.template.metadata.labels: selector does not match template labels: needs app=other"), "{e}");
    }

    #[test]
    fn probe_must_name_a_declared_port() {
        let e = errs(&DEPLOY.replace("tcpSocket: {port: http}", "tcpSocket: {port: web}"));
        assert!(e.contains("readinessProbe.tcpSocket.port: names port \"web\""), "{e}");
    }

    #[test]
    fn service_rules() {
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: echo}\nspec:\n  selector: {app: echo}\n  ports:\n  - {port: 80, targetPort: 8080}\n  - {port: 70000}\n";
        let e = errs(svc);
        assert!(e.contains("Service default/echo: spec.ports[0].name: required when a service has several ports"), "{e}");
        assert!(e.contains("spec.ports[1].port: must be between 1 and 65535 (got 70000)"), "{e}");
    }

    #[test]
    fn unknown_kind_and_wrong_api_version() {
        let e = errs("apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n");
        assert!(e.contains("Job default/j: kind: kind Job (apiVersion batch/v1) is not supported; supported kinds: Namespace (v1)"), "{e}");
        let e = errs("apiVersion: apps/v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, command: [x]}]}\n");
        assert!(e.contains("Pod default/p: apiVersion: Pod must have apiVersion v1 (got apps/v1)"), "{e}");
    }

    #[test]
    fn all_errors_reported_with_document_index() {
        let e = errs("apiVersion: v1\nkind: Namespace\nmetadata: {name: Bad}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n");
        assert!(e.contains("t.yaml: Namespace Bad: metadata.name"), "{e}");
        assert!(e.contains("t.yaml (document 2): Pod default/p: spec.containers: at least one container is required"), "{e}");
    }

    #[test]
    fn yaml_syntax_error() {
        let e = errs("apiVersion: v1\nkind: [\n");
        assert!(e.starts_with("t.yaml: not valid YAML"), "{e}");
    }

    #[test]
    fn kept_kinds_load_with_a_note() {
        let v =
            load_str("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: demo}\ndata: {a: b}\n", &Source("t.yaml".into()))
                .unwrap();
        assert!(v[0].warnings[0].contains("ConfigMap demo/cm: stored; the local cluster mounts no volumes"), "{:?}", v[0].warnings);
        // Enforced kinds load without a note.
        let v = load_str(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: demo}\nspec: {podSelector: {}}\n",
            &Source("t.yaml".into()),
        )
        .unwrap();
        assert!(v[0].warnings.is_empty(), "{:?}", v[0].warnings);
    }

    #[test]
    fn list_and_empty_documents() {
        let y = "---\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ServiceAccount, metadata: {name: a}}\n- {apiVersion: v1, kind: ServiceAccount, metadata: {name: b}}\n";
        assert_eq!(load_str(y, &Source("t".into())).unwrap().len(), 2);
    }

    #[test]
    fn env_field_refs() {
        let y = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    command: [x]\n    env:\n    - {name: A, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n    - {name: B, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}\n";
        let e = errs(y);
        assert!(e.contains("spec.containers[0].env[1].valueFrom.fieldRef.fieldPath: \"metadata.uid\" is not supported"), "{e}");
        assert!(!e.contains("env[0]"), "{e}");
    }
}
