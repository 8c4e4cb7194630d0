//! Run under the name `kubectl`, `istioctl` or `hubble`, slipstream takes
//! those tools' words (`main` calls [`as_tool`] before parsing); under the
//! name `slipstream-cni` it is the CNI plugin.

/// Run under the name `kubectl`, `istioctl` or `hubble` (a symlink, or an
/// alias), slipstream takes those tools' words: the tutorials' commands
/// work verbatim. `istioctl waypoint ...` is `x waypoint ...`, and
/// kubectl's `-n NS` before the verb goes after it.
pub fn as_tool(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let name = args.first().and_then(|a| std::path::Path::new(a).file_name()).and_then(|n| n.to_str()).unwrap_or("").to_string();
    match name.as_str() {
        "istioctl" if args.get(1).is_some_and(|a| a == "waypoint") => {
            args.insert(1, "x".into());
        }
        "kubectl" => {
            // `kubectl -n NS VERB ...` / `--namespace=NS`.
            if args.get(1).is_some_and(|a| a == "-n" || a == "--namespace") && args.len() > 3 {
                let flag = args.remove(1);
                let ns = args.remove(1);
                let at = if args.get(1).is_some_and(|v| v == "create" || v == "rollout" || v == "x") { 3 } else { 2 };
                let at = at.min(args.len());
                args.insert(at, ns);
                args.insert(at, flag);
            } else if let Some(ns) = args.get(1).and_then(|a| a.to_str()).and_then(|a| a.strip_prefix("--namespace=")).map(String::from) {
                args.remove(1);
                let at = 2.min(args.len());
                args.insert(at, ns.into());
                args.insert(at, "-n".into());
            }
        }
        _ => {}
    }
    args
}

/// Run by a container runtime under the name `slipstream-cni`, slipstream
/// is the CNI plugin: it speaks the CNI protocol and exits.
pub fn cni_plugin_if_named() {
    let name = std::env::args_os().next();
    if name.as_ref().and_then(|a| std::path::Path::new(a).file_name()).is_some_and(|n| n == slipstream_cni::conflist::PLUGIN_TYPE) {
        slipstream_cni::plugin::main();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tools_words_become_ours() {
        let v = |a: &[&str]| {
            super::as_tool(a.iter().map(std::ffi::OsString::from).collect())
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            v(&["/usr/local/bin/istioctl", "waypoint", "apply", "-n", "bookinfo"]),
            ["/usr/local/bin/istioctl", "x", "waypoint", "apply", "-n", "bookinfo"]
        );
        assert_eq!(v(&["istioctl", "x", "waypoint", "list"]), ["istioctl", "x", "waypoint", "list"]);
        assert_eq!(v(&["kubectl", "-n", "bookinfo", "get", "pods"]), ["kubectl", "get", "-n", "bookinfo", "pods"]);
        assert_eq!(v(&["kubectl", "--namespace=bookinfo", "get", "pods"]), ["kubectl", "get", "-n", "bookinfo", "pods"]);
        assert_eq!(
            v(&["kubectl", "-n", "bookinfo", "rollout", "restart", "deploy/x"]),
            ["kubectl", "rollout", "restart", "-n", "bookinfo", "deploy/x"]
        );
        assert_eq!(v(&["slipstream", "waypoint"]), ["slipstream", "waypoint"], "only under the tools' names");
        assert_eq!(v(&["hubble", "observe", "-f"]), ["hubble", "observe", "-f"]);
    }
}
