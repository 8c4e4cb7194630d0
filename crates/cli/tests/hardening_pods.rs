//! Issue 11, finding 7: a pod is confined as its securityContext says, and
//! by default (root, containerd's capabilities less NET_RAW) it still cannot
//! bypass the node proxy's capture, read the cluster's keys or the
//! operator's CA key, leave its cgroup, change the node's firewall, write
//! the machine's files or reach its services under /run; in its own PID
//! namespace with a
//! minimal /dev it cannot see, signal or stop the node proxy or the agent,
//! nor reach the machine's disks. Also strict field validation and the apply
//! input checks (duplicates, empty input, stdin).

mod common;
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: rootpod}
spec:
  containers:
  - {name: c, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: userpod}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}
  containers:
  - name: c
    command: [sleep, infinity]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Pod
metadata: {name: ropod}
spec:
  containers:
  - name: c
    command: [sleep, infinity]
    securityContext: {readOnlyRootFilesystem: true}
"#;

/// Sets the node proxy's bypass mark on a socket; prints `set` or the errno.
const SET_MARK: &str = "import socket\ns = socket.socket()\ntry:\n    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 0x539)\n    print('set')\nexcept OSError as e:\n    print('errno', e.errno)\n";

/// (exit code, stdout and stderr) of `exec [--privileged] POD -- CMD`.
fn exec(c: &Cluster, privileged: bool, pod: &str, cmd: &[&str]) -> (i32, String) {
    let mut a = vec!["exec"];
    if privileged {
        a.push("--privileged");
    }
    a.extend_from_slice(&[pod, "--"]);
    a.extend_from_slice(cmd);
    let o = c.run(&a);
    (o.status.code().unwrap_or(-1), text(&o))
}

fn sh(c: &Cluster, pod: &str, script: &str) -> (i32, String) {
    exec(c, false, pod, &["sh", "-c", script])
}

/// An operator's mesh root (valid for years): (certificate, key) paths in `dir`.
fn operator_ca(dir: &tempfile::TempDir) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, "t-hk-pods operator root");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    (write_manifest(dir, "root-cert.pem", &cert.pem()), write_manifest(dir, "root-key.pem", &key.serialize_pem()))
}

#[test]
fn pods_cannot_bypass_capture_read_keys_or_leave_their_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_manifest(&dir, "pods.yaml", PODS);
    // Outside /tmp (which pods do not share): only the cover hides it.
    let ca_dir = tempfile::Builder::new().prefix("t-hk-pods-ca").tempdir_in(std::env::var("HOME").unwrap_or("/root".into())).unwrap();
    let (ca_cert, ca_key) = operator_ca(&ca_dir);
    let c = Cluster::up("t-hk-pods", &["--nodes", "1", "-f", &m, "--ca-cert", &ca_cert, "--ca-key", &ca_key]);
    let st = c.status();
    let pid_of = |pod: &str| -> i64 {
        let p = st["pods"].as_array().unwrap().iter().find(|p| p["name"] == pod).unwrap_or_else(|| panic!("no pod {pod}"));
        assert_eq!(p["meshed"], true, "{pod} is meshed");
        p["containers"][0]["pid"].as_i64().unwrap()
    };
    let proxy_pid = st["nodes"][0]["proxy"]["pid"].as_i64().expect("node proxy pid");
    let key = format!("/run/slipstream/{}/ca/root-key.pem", c.name);
    assert!(std::path::Path::new(&key).exists(), "the CA key is where the test looks: {key}");
    let cg = cgroup2();

    // The controls: as an operator (exec --privileged) each attempt works,
    // so every refusal below is the confinement's doing.
    assert_eq!(exec(&c, true, "rootpod", &["python3", "-c", SET_MARK]).1.trim(), "set");
    assert_eq!(exec(&c, true, "rootpod", &["cat", &key]).0, 0);
    let (code, out) = exec(&c, true, "rootpod", &["cat", &ca_key]);
    assert!(code == 0 && out.contains("PRIVATE KEY"), "the operator's key, as root on the machine: {out}");
    let (code, out) = exec(&c, true, "rootpod", &["sh", "-c", "test -w /etc -a -w /usr/local/bin -a -w /etc/cron.d && ls /run"]);
    assert!(code == 0 && out.contains("netns"), "the machine's files are writable and /run full to root: {out}");
    // The rules an operator sees in the pod: capture on the nftables
    // datapath; none on the eBPF one (its programs are out of sight).
    let (code, out) = exec(&c, true, "rootpod", &["nft", "list", "ruleset"]);
    let ebpf = st["nodes"][0]["datapath"]["mode"] == "ebpf";
    assert!(code == 0 && out.contains("slipstream_mesh") != ebpf, "{out}");
    assert_eq!(exec(&c, true, "rootpod", &["id", "-u"]).1.trim(), "0");

    for (pod, other, uid, gid) in [("rootpod", "userpod", "0", "0"), ("userpod", "rootpod", "1000", "1000")] {
        let (code, out) = exec(&c, false, pod, &["id", "-u"]);
        assert_eq!((code, out.trim()), (0, uid), "{pod}: id -u");
        assert_eq!(exec(&c, false, pod, &["id", "-g"]).1.trim(), gid, "{pod}: id -g");
        // The capture cannot be bypassed: SO_MARK needs NET_ADMIN or NET_RAW.
        assert_eq!(exec(&c, false, pod, &["python3", "-c", SET_MARK]).1.trim(), "errno 1", "{pod}: SO_MARK 0x539 must be EPERM");
        // The cluster's files are hidden: keys, sockets, other pods' logs.
        let (code, out) = exec(&c, false, pod, &["cat", &key]);
        assert_ne!(code, 0, "{pod} read the CA key: {out}");
        // /run is the pod's own, empty: no cluster state, no D-Bus, systemd,
        // Docker or user sockets, no /run/netns.
        let (code, out) = sh(&c, pod, "ls -A /run");
        assert_eq!((code, out.trim()), (0, ""), "{pod}: /run must be empty");
        // The operator's --ca-key is covered by an empty file (which root,
        // with DAC_OVERRIDE, reads; uid 1000 cannot even reach it).
        let (code, out) = exec(&c, false, pod, &["cat", &ca_key]);
        assert!(!out.contains("PRIVATE KEY"), "{pod} read the operator's CA key at {ca_key}: {out}");
        if pod == "rootpod" {
            assert_eq!((code, out.as_str()), (0, ""), "{pod}: the operator's CA key at {ca_key}");
        }
        // Another pod's and the node proxy's files through /proc are closed.
        for (target, pid) in [(other, pid_of(other)), ("the node proxy", proxy_pid)] {
            let (code, out) = sh(&c, pod, &format!("ls /proc/{pid}/root/run/ || cat /proc/{pid}/environ"));
            assert_ne!(code, 0, "{pod} reached the files of {target} (pid {pid}): {out}");
        }
        // The cgroup file systems are read-only: no way out of its cgroup.
        for target in [cg.join("cgroup.procs"), cg.join("slipstream").join(&c.name).join("cgroup.procs")] {
            let (code, out) = sh(&c, pod, &format!("echo $$ > {}", target.display()));
            assert_ne!(code, 0, "{pod} moved itself to {}: {out}", target.display());
        }
        // The node's firewall (the capture rules) is out of reach.
        let (code, out) = exec(&c, false, pod, &["nft", "list", "ruleset"]);
        assert_ne!(code, 0, "{pod} listed the nftables rules: {out}");
    }
    // Every process of each pod is still in the pod's own cgroup.
    for pod in ["rootpod", "userpod"] {
        let procs = std::fs::read_to_string(format!("/proc/{}/cgroup", pid_of(pod))).unwrap();
        assert!(procs.contains(&format!("/slipstream/{}/", c.name)), "{pod}: {procs}");
    }

    // The machine's files are read-only even to a root pod (with
    // DAC_OVERRIDE): no preloaded library, no binary, no cron job.
    for target in ["/etc/ld.so.preload", "/usr/local/bin/t-hk-pods-x", "/etc/cron.d/t-hk-pods-x"] {
        let (code, out) = sh(&c, "rootpod", &format!(": >> {target}"));
        assert!(code != 0 && out.contains("Read-only file system"), "rootpod wrote {target}: {code} {out}");
    }
    // Its /tmp and /var/tmp are private and writable, by any user.
    for (pod, tmp) in [("rootpod", "/tmp"), ("rootpod", "/var/tmp"), ("userpod", "/tmp")] {
        let file = format!("{tmp}/t-hk-pods-{pod}");
        let (code, out) = sh(&c, pod, &format!("echo private > {file} && cat {file}"));
        assert_eq!((code, out.trim()), (0, "private"), "{pod} writes {file}");
        assert!(!std::path::Path::new(&file).exists(), "the machine's {tmp} shows {pod}'s {file}");
    }
    // readOnlyRootFilesystem: even its private /tmp is read-only.
    for target in ["/opt/t-hk-pods-probe", "/tmp/t-hk-pods-probe"] {
        let (code, out) = sh(&c, "ropod", &format!("touch {target}"));
        assert!(code != 0 && out.contains("Read-only file system"), "ropod: {target}: {out}");
    }
    // A non-root pod cannot gain privileges (no_new_privs) nor act as root.
    let (_, out) = sh(&c, "userpod", "grep -E '^(NoNewPrivs|CapEff|CapBnd)' /proc/self/status");
    assert!(out.contains("NoNewPrivs:\t1") && out.contains("CapEff:\t0000000000000000"), "{out}");
    c.down();
}

const WEB: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replcas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      securityContext: {runAsNonRoot: true, runAsUser: 1000}\n      containers:\n      - {name: c, command: [sleep, infinity], imagePullPolicy: Always}\n";

#[test]
fn apply_refuses_unknown_fields_duplicates_and_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ns = write_manifest(&dir, "ns.yaml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n");
    let c = Cluster::up("t-hk-apply", &["--nodes", "1", "-f", &ns]);
    let web = write_manifest(&dir, "web.yaml", WEB);

    let o = c.run(&["apply", "-f", &web]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains(&format!("{web}: Deployment default/web: spec.replcas: unknown field")), "{out}");
    assert!(c.pods("web-").is_empty(), "a refused apply changed nothing");

    // Duplicates name both places; an empty file is nothing to apply.
    let dup = write_manifest(&dir, "dup.yaml", &format!("{WEB}---\n{WEB}"));
    let out = text(&c.run(&["apply", "--validate=ignore", "-f", &dup]));
    assert!(out.contains(&format!("{dup} (document 2): Deployment default/web: defined twice: also in {dup}")), "{out}");
    let empty = write_manifest(&dir, "empty.yaml", "# nothing\n");
    let o = c.run(&["apply", "-f", &empty]);
    assert!(!o.status.success() && text(&o).contains("no objects passed to apply"), "{}", text(&o));
    assert!(c.pods("web-").is_empty());

    // --validate=warn applies it, from standard input, with the warnings.
    let mut child = Command::new(bin())
        .args(["--cluster", &c.name, "apply", "--validate=warn", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(WEB.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("warning: <stdin>: Deployment default/web: spec.replcas: unknown field, dropped"), "{out}");
    assert!(out.contains("spec.template.spec.containers[0].imagePullPolicy: ignored by the local cluster"), "{out}");
    let pods = c.pods("web-");
    assert_eq!(pods.len(), 1, "one replica (the misspelled field was dropped)");
    let pod = pods[0]["name"].as_str().unwrap().to_string();
    assert_eq!(c.exec("default", &pod, &["id", "-u"]).1.trim(), "1000");
    c.down();
}

const PIDNS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: client}
spec:
  replicas: 1
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      containers: [{name: client, command: [sleep, infinity]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000}
      containers:
      - name: echo
        command: [slipstream, app, echo]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: http}}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: userpod}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}
  containers:
  - name: c
    command: [sleep, infinity]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
"#;

/// What a confined pod's /dev holds, and nothing else.
const MINIMAL_DEV: &str = "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero";

/// The command line of every process a pod sees in /proc, one a line.
const LIST_PROCS: &str = "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(tr '\\0' ' ' < $p/cmdline)\"; done";

#[test]
fn pods_see_only_their_own_processes_and_a_minimal_dev() {
    let dir = tempfile::tempdir().unwrap();
    let m = write_manifest(&dir, "pidns.yaml", PIDNS);
    let c = Cluster::up("t-hk-pidns", &["--nodes", "1", "-f", &m]);
    let st = c.status();
    let proxy_pid = st["nodes"][0]["proxy"]["pid"].as_i64().expect("node proxy pid");
    let agent_pid = st["agent"]["pid"].as_i64().unwrap();
    let client = c.pods("client-")[0]["name"].as_str().unwrap().to_string();
    let node = tempfile::tempdir_in("/var/tmp").unwrap();
    let node_path = node.path().join("disk").display().to_string();

    // The controls: as an operator (exec --privileged: the machine's PID
    // namespace and /dev, every capability) each attempt works.
    let (code, out) = exec(&c, true, &client, &["kill", "-0", &proxy_pid.to_string()]);
    assert_eq!(code, 0, "the node proxy is visible to a privileged exec: {out}");
    let (code, out) = exec(&c, true, &client, &["sh", "-c", &format!("mknod {node_path} b 8 0 && rm {node_path}")]);
    assert_eq!(code, 0, "a privileged exec makes a block device node: {out}");
    let (_, host_dev) = exec(&c, true, &client, &["ls", "/dev"]);
    assert!(host_dev.split_whitespace().count() > MINIMAL_DEV.split(' ').count(), "the machine's /dev is larger: {host_dev}");

    for pod in [client.as_str(), "userpod"] {
        // The node proxy and the agent are not there to signal.
        for (what, sig, pid) in [("the node proxy", "-STOP", proxy_pid), ("the agent", "-9", agent_pid)] {
            let (code, out) = exec(&c, false, pod, &["kill", sig, &pid.to_string()]);
            assert!(code != 0 && out.contains("No such process"), "{pod}: kill {sig} {what} ({pid}): {code} {out}");
        }
        // /proc holds the pod's own processes: PID 1 its init, then the
        // container's command and this exec.
        let (code, out) = sh(&c, pod, LIST_PROCS);
        assert_eq!(code, 0, "{out}");
        let procs: Vec<(i64, &str)> = out.lines().filter_map(|l| l.split_once(' ')).map(|(p, cmd)| (p.parse().unwrap(), cmd)).collect();
        assert!(procs.iter().any(|(p, cmd)| *p == 1 && cmd.contains("pod-init")), "{pod}: PID 1 is pod-init: {out}");
        assert!(procs.iter().any(|(p, cmd)| *p > 1 && cmd.starts_with("sleep infinity")), "{pod}: its command: {out}");
        for (pid, cmd) in &procs {
            assert!(*pid != proxy_pid && *pid != agent_pid, "{pod} sees the node proxy or the agent: {out}");
            assert!(
                cmd.contains("pod-init") || cmd.starts_with("sleep infinity") || cmd.starts_with("sh -c") || cmd.is_empty(),
                "{pod} sees a process that is not its own: {pid} {cmd}"
            );
        }
        // /dev is the minimal set: no disks, no /dev/mem.
        let (code, out) = exec(&c, false, pod, &["ls", "/dev"]);
        assert_eq!((code, out.split_whitespace().collect::<Vec<_>>().join(" ")), (0, MINIMAL_DEV.to_string()), "{pod}: /dev");
        let (code, out) = exec(&c, false, pod, &["sh", "-c", "echo ok > /dev/null && head -c 4 /dev/urandom | wc -c"]);
        assert_eq!((code, out.trim()), (0, "4"), "{pod}: /dev/null and /dev/urandom work");
        // No CAP_MKNOD, even for root: no node for the machine's disk (in
        // the pod's own /tmp, writable, so only the capability is missing).
        let (code, out) = exec(&c, false, pod, &["sh", "-c", "mknod /tmp/disk b 8 0 || ls /tmp/disk"]);
        assert!(code != 0 && out.contains("Operation not permitted") && out.contains("No such file"), "{pod}: mknod: {code} {out}");
    }

    // The node proxy was never touched, and still carries meshed traffic.
    let st = c.status();
    assert_eq!(st["nodes"][0]["proxy"]["pid"].as_i64(), Some(proxy_pid), "the node proxy is the same process");
    assert_eq!(st["nodes"][0]["proxy"]["restarts"], 0);
    assert_eq!(st["agent"]["pid"].as_i64(), Some(agent_pid));
    assert!(st["pods"].as_array().unwrap().iter().all(|p| p["meshed"] == true), "every pod is meshed");
    let (code, out) = c.exec("default", "deploy/client", &["curl", "-sS", "--max-time", "5", "http://echo:8080/healthz"]);
    assert_eq!(code, 0, "meshed curl from the client to echo: {out}");

    // Exit codes pass through pod-init unchanged.
    assert_eq!(sh(&c, "deploy/client", "exit 7").0, 7);
    // A signal sent to the pid `status` shows (pod-init) reaches the
    // command, which shows as killed by it (128+15), and restarts.
    let user_pid = c.pods("userpod")[0]["containers"][0]["pid"].as_i64().unwrap();
    assert!(Command::new("kill").args(["-TERM", &user_pid.to_string()]).status().unwrap().success());
    wait_until("userpod to restart after SIGTERM with exit code 143", Duration::from_secs(20), || {
        let p = &c.pods("userpod")[0];
        p["restarts"] == 1 && p["containers"][0]["lastExitCode"] == 143 && p["ready"] == true
    });
    c.down();
}

#[test]
fn graceful_stop_reaches_the_command_under_pod_init() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("stopped");
    // Privileged, to write the machine's /tmp (confined pods have their
    // own); it still runs under pod-init. Its `sleep 1` loop is the
    // workload, not synchronization: sh runs the trap between two sleeps.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: trapper}}\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: c\n    securityContext: {{privileged: true}}\n    command: [sh, -c, \"trap 'echo stopped > {}; exit 0' TERM; while true; do sleep 1; done\"]\n",
        marker.display()
    );
    let m = write_manifest(&dir, "trap.yaml", &pod);
    let c = Cluster::up("t-hk-stop", &["--nodes", "1", "-f", &m]);
    let started = std::time::Instant::now();
    c.ok(&["delete", "-f", &m]);
    assert_eq!(std::fs::read_to_string(&marker).unwrap_or_default().trim(), "stopped", "the SIGTERM trap ran");
    assert!(started.elapsed() < Duration::from_secs(20), "stopped on SIGTERM, not killed after the grace period: {:?}", started.elapsed());
    assert!(c.pods("trapper").is_empty());
    c.down();
}
