//! `securityContext`: the settings one container runs with (the container's
//! own over the pod's, as in Kubernetes) and their validation.

use crate::error::FieldError;
use crate::objects::{Container, PodSecurityContext, PodSpec, SecurityContext};
use serde::{Deserialize, Serialize};

/// Kubernetes accepts user and group ids from 0 to 2^31-1.
pub const MAX_ID: i64 = i32::MAX as i64;

/// What one container runs as, resolved from its pod's and its own
/// `securityContext`. Unset ids are 0 (root), as with an image that names no
/// user. Capability names are canonical (`CAP_NET_ADMIN`) or `ALL`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSecurity {
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supplemental_groups: Vec<u32>,
    #[serde(default)]
    pub privileged: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_privilege_escalation: Option<bool>,
    #[serde(default)]
    pub read_only_root_filesystem: bool,
}

/// `NET_ADMIN`, `cap_net_admin` and `CAP_NET_ADMIN` all name CAP_NET_ADMIN
/// (containerd upper-cases and prefixes); `ALL` stands for every one.
pub fn canonical_capability(name: &str) -> Option<String> {
    if name.eq_ignore_ascii_case("ALL") {
        return Some("ALL".into());
    }
    name.parse::<caps::Capability>().or_else(|_| caps::to_canonical(name).parse()).ok().map(|c| c.to_string())
}

/// The settings container `c` of a pod with `pod` settings runs with.
/// Assumes a validated spec (ids in range, known capability names).
pub fn effective(pod: Option<&PodSecurityContext>, c: Option<&SecurityContext>) -> ContainerSecurity {
    let id = |v: Option<i64>| v.unwrap_or(0).clamp(0, MAX_ID) as u32;
    let uid = c.and_then(|c| c.run_as_user).or(pod.and_then(|p| p.run_as_user));
    let gid = c.and_then(|c| c.run_as_group).or(pod.and_then(|p| p.run_as_group));
    let mut groups: Vec<u32> = Vec::new();
    if let Some(p) = pod {
        for g in p.fs_group.iter().chain(p.supplemental_groups.iter()) {
            let g = id(Some(*g));
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    let caps = c.and_then(|c| c.capabilities.as_ref());
    let names = |v: Option<&Vec<String>>| -> Vec<String> {
        v.map(|v| v.iter().filter_map(|n| canonical_capability(n)).collect()).unwrap_or_default()
    };
    ContainerSecurity {
        uid: id(uid),
        gid: id(gid),
        supplemental_groups: groups,
        privileged: c.and_then(|c| c.privileged).unwrap_or(false),
        add: names(caps.map(|c| &c.add)),
        drop: names(caps.map(|c| &c.drop)),
        allow_privilege_escalation: c.and_then(|c| c.allow_privilege_escalation),
        read_only_root_filesystem: c.and_then(|c| c.read_only_root_filesystem).unwrap_or(false),
    }
}

/// The settings of container `ct` of `spec`.
pub fn of_container(spec: &PodSpec, ct: &Container) -> ContainerSecurity {
    effective(spec.security_context.as_ref(), ct.security_context.as_ref())
}

/// Validates the pod-level settings (`f` is the pod spec's path).
pub fn check_pod(f: &str, sc: &PodSecurityContext) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let sf = format!("{f}.securityContext");
    for (v, name) in [(sc.run_as_user, "runAsUser"), (sc.run_as_group, "runAsGroup"), (sc.fs_group, "fsGroup")] {
        check_id(&mut errors, &format!("{sf}.{name}"), v);
    }
    for (i, g) in sc.supplemental_groups.iter().enumerate() {
        check_id(&mut errors, &format!("{sf}.supplementalGroups[{i}]"), Some(*g));
    }
    errors
}

/// Validates a container's settings as combined with its pod's (`cf` is the
/// container's path, `f` the pod spec's).
pub fn check_container(f: &str, cf: &str, pod: Option<&PodSecurityContext>, ct: &Container) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let sf = format!("{cf}.securityContext");
    if let Some(sc) = &ct.security_context {
        check_id(&mut errors, &format!("{sf}.runAsUser"), sc.run_as_user);
        check_id(&mut errors, &format!("{sf}.runAsGroup"), sc.run_as_group);
        if let Some(c) = &sc.capabilities {
            for (list, name) in [(&c.add, "add"), (&c.drop, "drop")] {
                for (i, cap) in list.iter().enumerate() {
                    if canonical_capability(cap).is_none() {
                        errors.push(FieldError {
                            field: format!("{sf}.capabilities.{name}[{i}]"),
                            message: format!("unknown capability {}", crate::names::shown(cap)),
                        });
                    }
                }
            }
        }
        // The API server's own rules.
        if sc.allow_privilege_escalation == Some(false) {
            if sc.privileged == Some(true) {
                errors.push(FieldError {
                    field: format!("{sf}.allowPrivilegeEscalation"),
                    message: "cannot be false while privileged is true".into(),
                });
            }
            let adds_sys_admin = sc
                .capabilities
                .as_ref()
                .is_some_and(|c| c.add.iter().any(|n| matches!(canonical_capability(n).as_deref(), Some("CAP_SYS_ADMIN" | "ALL"))));
            if adds_sys_admin {
                errors.push(FieldError {
                    field: format!("{sf}.allowPrivilegeEscalation"),
                    message: "cannot be false while capabilities.add has CAP_SYS_ADMIN".into(),
                });
            }
        }
    }
    // runAsNonRoot: the kubelet refuses to start a container that would run
    // as root; with no image to read a user from, unset runAsUser is root.
    let non_root = ct.security_context.as_ref().and_then(|c| c.run_as_non_root).or(pod.and_then(|p| p.run_as_non_root));
    if non_root == Some(true) {
        let c_uid = ct.security_context.as_ref().and_then(|c| c.run_as_user);
        let uid = c_uid.or(pod.and_then(|p| p.run_as_user));
        if uid.unwrap_or(0) == 0 {
            let (field, what) = match (c_uid, uid) {
                (Some(_), _) => (format!("{sf}.runAsUser"), "is 0"),
                (None, Some(_)) => (format!("{f}.securityContext.runAsUser"), "is 0"),
                (None, None) => {
                    (format!("{sf}.runAsUser"), "is not set (the local cluster has no image to take a user from, so it would be 0)")
                }
            };
            errors.push(FieldError {
                field,
                message: format!("{what} while runAsNonRoot is true: container {:?} would run as root", ct.name),
            });
        }
    }
    errors
}

fn check_id(errors: &mut Vec<FieldError>, field: &str, v: Option<i64>) {
    if let Some(v) = v {
        if !(0..=MAX_ID).contains(&v) {
            errors.push(FieldError { field: field.into(), message: format!("must be between 0 and {MAX_ID} (got {v})") });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{load_str, Source};
    use crate::objects::Object;

    fn pod(pod_sc: &str, ct_sc: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  securityContext: {pod_sc}\n  containers:\n  - name: c\n    command: [x]\n    securityContext: {ct_sc}\n"
        )
    }

    fn load(pod_sc: &str, ct_sc: &str) -> Result<ContainerSecurity, String> {
        let v = load_str(&pod(pod_sc, ct_sc), &Source("p.yaml".into())).map_err(|e| e.to_string())?;
        let Object::Pod(p) = &v[0].object else { panic!("not a pod") };
        Ok(of_container(&p.spec, &p.spec.containers[0]))
    }

    #[test]
    fn container_overrides_pod() {
        let s = load("{runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, supplementalGroups: [3000, 2000]}", "{runAsUser: 1001}").unwrap();
        assert_eq!((s.uid, s.gid, s.supplemental_groups.clone()), (1001, 1000, vec![2000, 3000]));
        let s = load("{}", "{}").unwrap();
        assert_eq!(s, ContainerSecurity::default(), "nothing set: root, as an image without USER");
        let s = load(
            "{runAsUser: 7}",
            "{capabilities: {add: [net_bind_service], drop: [ALL]}, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true}",
        )
        .unwrap();
        assert_eq!(s.uid, 7);
        assert_eq!(s.add, vec!["CAP_NET_BIND_SERVICE"]);
        assert_eq!(s.drop, vec!["ALL"]);
        assert_eq!(s.allow_privilege_escalation, Some(false));
        assert!(s.read_only_root_filesystem && !s.privileged);
    }

    #[test]
    fn validation_table() {
        let cases: &[(&str, &str, &str)] = &[
            ("{runAsNonRoot: true}", "{}", "spec.containers[0].securityContext.runAsUser: is not set"),
            ("{runAsNonRoot: true, runAsUser: 0}", "{}", "Pod default/p: spec.securityContext.runAsUser: is 0 while runAsNonRoot is true"),
            ("{}", "{runAsNonRoot: true, runAsUser: 0}", "spec.containers[0].securityContext.runAsUser: is 0 while runAsNonRoot"),
            ("{runAsUser: -1}", "{}", "spec.securityContext.runAsUser: must be between 0 and 2147483647 (got -1)"),
            ("{supplementalGroups: [1, 4294967296]}", "{}", "spec.securityContext.supplementalGroups[1]: must be between"),
            ("{}", "{runAsGroup: 2147483648}", "spec.containers[0].securityContext.runAsGroup: must be between"),
            (
                "{}",
                "{capabilities: {add: [NET_ADMIN, NET_FLY]}}",
                "spec.containers[0].securityContext.capabilities.add[1]: unknown capability \"NET_FLY\"",
            ),
            ("{}", "{capabilities: {drop: [CAP_BOGUS]}}", "capabilities.drop[0]: unknown capability \"CAP_BOGUS\""),
            (
                "{}",
                "{privileged: true, allowPrivilegeEscalation: false}",
                "allowPrivilegeEscalation: cannot be false while privileged is true",
            ),
            (
                "{}",
                "{capabilities: {add: [SYS_ADMIN]}, allowPrivilegeEscalation: false}",
                "cannot be false while capabilities.add has CAP_SYS_ADMIN",
            ),
            ("{}", "{runAsUser: root}", "spec.containers[0].securityContext.runAsUser: invalid type"),
        ];
        for (p, c, want) in cases {
            let e = load(p, c).expect_err(&format!("{p} {c} must be refused"));
            assert!(e.contains(want), "{p} {c}:\n{e}\nwanted: {want}");
        }
        // Accepted: non-root by the container's id; runAsNonRoot false with root.
        assert!(load("{runAsNonRoot: true}", "{runAsUser: 1000}").is_ok());
        assert!(load("{runAsNonRoot: false}", "{}").is_ok());
        assert!(load("{}", "{privileged: true}").unwrap().privileged);
    }
}
