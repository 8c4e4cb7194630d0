//! One pass of the node agent over its node's pods: each pod's wanted
//! membership (its labels and its namespace's) against where it stands,
//! one enrolment step each (`crate::enrol::next_step`), then the node
//! proxy's pod list and the probe table written when they changed. The
//! pods and namespaces come from the agent's watches; what the CNI said of
//! each pod's sandbox from its calls ([`Sandbox`]); where each pod stands
//! is kept here between passes ([`Entry`]).

use super::{discover, files, probes};
use crate::capture;
use crate::datapath::{self, Capture};
use crate::enrol::{self, State, Step};
use k8s_openapi::api::core::v1::Pod;
use slipstream_core::{NodePods, PodRegistration};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

/// What the CNI told of a pod's sandbox (ADD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub uid: String,
    pub netns: PathBuf,
    pub ips: Vec<IpAddr>,
}

/// How a pod's CNI ADD is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Meshed: its capture is on and the node proxy listens in it.
    Meshed,
    /// Not meshed: nothing of ours in it.
    NotMeshed,
    /// Still on its way, and why.
    Waiting(String),
}

/// A pod the agent acts on, and where it stands.
#[derive(Debug, Clone)]
pub struct Entry {
    pub workload_uid: String,
    pub netns: PathBuf,
    pub ip: Ipv4Addr,
    pub state: State,
}

/// The agent's settings a pass needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node: String,
    pub cluster_id: String,
    pub run_dir: PathBuf,
    pub netns_dir: PathBuf,
    pub proc_dir: PathBuf,
    /// Rewrite kubelet probes (see `probes`).
    pub probes: bool,
    /// Where this container writes pods' sysctls (`capture::enable_ebpf_support`).
    pub sysctl_net: PathBuf,
    /// An eBPF datapath an earlier install left pinned on a node that now
    /// runs nftables capture: removed once its pods are adopted.
    pub stale_bpf_dir: Option<PathBuf>,
}

/// `namespace/name`.
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default())
}

/// Whether the pod has a network namespace of its own that may be meshed.
fn eligible(pod: &Pod) -> bool {
    let spec_host = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    !spec_host && phase != "Succeeded" && phase != "Failed"
}

/// The agent's memory between passes.
#[derive(Debug, Default)]
pub struct Node {
    pub entries: BTreeMap<String, Entry>,
    /// The datapath meshed pods are put on (only meshed pods: the node's
    /// other pods keep the primary CNI's path untouched).
    pub capture: Capture,
    written: Option<NodePods>,
    /// The probe table's addresses as last written, and when: it is
    /// written again when they change, and every [`PROBES_REFRESH`] in
    /// case something of the node removed it (a firewall reload).
    probes_written: Option<(BTreeSet<Ipv4Addr>, std::time::Instant)>,
    /// When each pod's namespace was last looked for in /proc (a scan of
    /// every process): at most every [`DISCOVERY_RETRY`] per pod.
    discovered_at: BTreeMap<String, std::time::Instant>,
}

const DISCOVERY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

const PROBES_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

impl Node {
    /// Adopts what the last agent left: the pods of pods.json are meshed
    /// and captured (capture is only ever on for a registered pod).
    pub fn adopt(s: &Settings, capture: Capture) -> Node {
        let mut node = Node { capture, ..Node::default() };
        for r in files::read_pods(&s.run_dir, &s.node).pods {
            let Some(key) = r.uid.split("//Pod/").nth(1).map(str::to_string) else { continue };
            let ip = match r.ip {
                Some(IpAddr::V4(ip)) => ip,
                _ => continue,
            };
            node.entries.insert(
                key,
                Entry { workload_uid: r.uid.clone(), netns: PathBuf::from(&r.netns), ip, state: State { meshed: true, captured: true } },
            );
        }
        if !node.entries.is_empty() {
            tracing::info!(pods = node.entries.len(), "adopted the meshed pods the previous agent left");
        }
        node.recapture(s);
        if let Some(stale) = &s.stale_bpf_dir {
            // An earlier install's eBPF datapath, on a node now running
            // nftables capture: its pods were just captured by nftables;
            // its programs and maps go.
            match slipstream_ebpf::remove_all(stale) {
                Ok(()) => {
                    tracing::info!(dir = %stale.display(), "the eBPF datapath of an earlier install removed (this install runs nftables capture)")
                }
                Err(e) => tracing::error!(dir = %stale.display(), "removing the eBPF datapath of an earlier install: {e}"),
            }
        }
        node
    }

    /// Adopted pods whose capture is not there any more (their datapath
    /// was removed, or the install switched from eBPF to nftables) are
    /// captured again by this agent's datapath, before anything else.
    fn recapture(&mut self, s: &Settings) {
        let probes = s.probes.then_some(capture::PROBE_SOURCE);
        for (key, e) in &mut self.entries {
            let dp_key = datapath_key(key);
            if self.capture.still_captures(&dp_key, &e.netns) || !e.netns.exists() {
                continue;
            }
            let pod = datapath::Pod { key: &dp_key, netns: &e.netns, ip: e.ip, node: 0, meshed: true };
            match self.capture.set_meshed(&pod, false, probes) {
                Ok(()) => tracing::warn!(pod = %key, datapath = self.capture.name(), "adopted pod was no longer captured: captured again"),
                Err(err) => {
                    tracing::error!(pod = %key, "adopted pod is not captured and capturing it failed: {err} (retried as a new enrolment)");
                    e.state.captured = false;
                }
            }
            if !self.capture.is_ebpf() {
                let _ = capture::set_ebpf_sysctls(&e.netns, false, &s.sysctl_net);
            }
        }
    }

    /// One pass. `pods`: the node's pods from the watch; `labels`: each
    /// namespace's labels; `sandboxes`: what the CNI said, by pod key.
    pub fn pass(
        &mut self,
        s: &Settings,
        pods: &[std::sync::Arc<Pod>],
        labels: &BTreeMap<String, BTreeMap<String, String>>,
        sandboxes: &BTreeMap<String, Sandbox>,
    ) -> BTreeMap<String, Answer> {
        let served = files::read_served(&s.run_dir, &s.node);
        let mut answers = BTreeMap::new();
        // Pods gone from the node first: a new pod given a gone one's
        // address in this same pass must not lose its entries to it.
        let present: BTreeSet<String> = pods.iter().filter(|p| eligible(p)).map(|p| pod_key(p)).collect();
        self.discovered_at.retain(|key, _| present.contains(key));
        let gone: Vec<String> = self.entries.keys().filter(|k| !present.contains(*k)).cloned().collect();
        for key in gone {
            if let Some(e) = self.entries.remove(&key) {
                tracing::info!(pod = %key, workload = %e.workload_uid, "pod gone: the node proxy lets it go");
                self.forget(&key, &e);
            }
        }
        for pod in pods.iter().filter(|p| eligible(p)) {
            let key = pod_key(pod);
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let no_labels = BTreeMap::new();
            let (ns_labels, pod_labels) = (labels.get(&ns).unwrap_or(&no_labels), pod.metadata.labels.as_ref().unwrap_or(&no_labels));
            let want = enrol::is_meshed(ns_labels, pod_labels);
            let path = CapturePath { nftables: enrol::wants_nftables(ns_labels, pod_labels) };
            let answer = self.step(s, pod, &key, (want, path), sandboxes.get(&key), &served);
            answers.insert(key, answer);
        }
        self.write(s);
        answers
    }

    fn step(
        &mut self,
        s: &Settings,
        pod: &Pod,
        key: &str,
        (want, path): (bool, CapturePath),
        sandbox: Option<&Sandbox>,
        served: &BTreeSet<String>,
    ) -> Answer {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // A new sandbox of the same pod (its old one was torn down): start over.
        if let (Some(sb), Some(e)) = (sandbox, self.entries.get(key)) {
            if sb.netns != e.netns && (sb.uid.is_empty() || sb.uid == uid) {
                tracing::info!(pod = %key, old = %e.netns.display(), new = %sb.netns.display(), "pod has a new sandbox");
                if let Some(old) = self.entries.remove(key) {
                    self.forget(key, &old);
                }
            }
        }
        if !self.entries.contains_key(key) {
            if !want {
                return Answer::NotMeshed;
            }
            if sandbox.is_none() {
                let now = std::time::Instant::now();
                if self.discovered_at.get(key).is_some_and(|at| now.duration_since(*at) < DISCOVERY_RETRY) {
                    return Answer::Waiting("its network namespace is looked for again shortly".into());
                }
                self.discovered_at.insert(key.to_string(), now);
            }
            match locate(s, pod, &uid, sandbox) {
                Ok((netns, ip)) => {
                    let workload_uid = enrol::workload_uid(
                        &s.cluster_id,
                        pod.metadata.namespace.as_deref().unwrap_or_default(),
                        pod.metadata.name.as_deref().unwrap_or_default(),
                    );
                    self.entries.insert(key.to_string(), Entry { workload_uid, netns, ip, state: State::default() });
                }
                Err(why) => return Answer::Waiting(why),
            }
        }
        let Some(e) = self.entries.get_mut(key) else { return Answer::NotMeshed };
        let step = enrol::next_step(e.state, want, served.contains(&e.workload_uid));
        apply(s, &mut self.capture, key, e, step, path);
        match (want, e.state) {
            (true, State { captured: true, .. }) => Answer::Meshed,
            (true, State { meshed: true, .. }) => Answer::Waiting("the node proxy has not reported its listeners in the pod yet".into()),
            (true, _) => Answer::Waiting("being registered with the node proxy".into()),
            (false, State { captured: false, meshed: false }) => Answer::NotMeshed,
            (false, _) => Answer::Waiting("leaving the mesh".into()),
        }
    }

    /// Writes pods.json and the probe table when they changed.
    fn write(&mut self, s: &Settings) {
        let mut pods: Vec<PodRegistration> = self
            .entries
            .values()
            .filter(|e| e.state.meshed)
            .map(|e| PodRegistration { uid: e.workload_uid.clone(), netns: e.netns.display().to_string(), ip: Some(IpAddr::V4(e.ip)) })
            .collect();
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        let pods = NodePods { pods };
        if self.written.as_ref() != Some(&pods) {
            match files::write_pods(&s.run_dir, &s.node, &pods) {
                Ok(()) => self.written = Some(pods),
                Err(e) => tracing::error!("cannot write {}: {e} (retried)", files::pods_file(&s.run_dir, &s.node).display()),
            }
        }
        if !s.probes {
            return;
        }
        let captured: BTreeSet<Ipv4Addr> = self.entries.values().filter(|e| e.state.captured).map(|e| e.ip).collect();
        let fresh = self.probes_written.as_ref().is_some_and(|(ips, at)| *ips == captured && at.elapsed() < PROBES_REFRESH);
        if !fresh {
            match probes::apply(&captured) {
                Ok(()) => self.probes_written = Some((captured, std::time::Instant::now())),
                Err(e) => tracing::error!("kubelet probes of meshed pods: {e} (retried)"),
            }
        }
    }

    /// Uninstall: every pod's capture off, the node proxy told to let them
    /// all go, the probe table removed.
    pub fn release_all(&mut self, s: &Settings) {
        for (key, e) in &mut self.entries {
            if e.state.captured {
                apply(s, &mut self.capture, key, e, Some(Step::Release), CapturePath::default());
            }
            if let Err(err) = capture::remove_reply_route(&e.netns) {
                tracing::warn!(pod = %key, "removing the reply route: {err}");
            }
            e.state = State::default();
        }
        self.entries.clear();
        self.write(s);
        if let Err(e) = probes::remove() {
            tracing::warn!("removing the probe table: {e}");
        }
    }
}

impl Node {
    /// A pod that went (or whose sandbox was replaced): its entries on the
    /// datapath go with it (its namespace, and with it its capture rules,
    /// is gone already).
    fn forget(&mut self, key: &str, e: &Entry) {
        // Another pod holds its address now (a pod still listed while it
        // terminated, its address already given again): only its own
        // programs go, the entries of the address are the other pod's.
        let reused = self.entries.values().any(|o| o.ip == e.ip);
        let r = if reused { self.capture.withdraw_links(&datapath_key(key)) } else { self.capture.withdraw(&datapath_key(key), e.ip) };
        if let Err(err) = r {
            tracing::warn!(pod = %key, "{err}");
        }
    }
}

/// Which path a pod's capture takes on an eBPF node.
#[derive(Debug, Clone, Copy, Default)]
struct CapturePath {
    /// `slipstream.io/datapath: nftables` on the pod or its namespace.
    nftables: bool,
}

/// A pod's key on the datapath from its `namespace/name`.
fn datapath_key(key: &str) -> String {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    datapath::pod_key(ns, name)
}

/// A meshed pod's network namespace and address: the CNI's word, else
/// found from its processes (it ran before the agent).
fn locate(s: &Settings, pod: &Pod, uid: &str, sandbox: Option<&Sandbox>) -> Result<(PathBuf, Ipv4Addr), String> {
    let from_status = pod.status.as_ref().and_then(|st| st.pod_ip.as_deref()).and_then(|ip| ip.parse::<Ipv4Addr>().ok());
    if let Some(sb) = sandbox.filter(|sb| sb.uid.is_empty() || sb.uid == uid) {
        let ip = sb.ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        return ip
            .or(from_status)
            .map(|ip| (sb.netns.clone(), ip))
            .ok_or_else(|| "its CNI result has no IPv4 address (the mesh is IPv4 here)".into());
    }
    let ip = from_status.ok_or("its sandbox has no address yet")?;
    let netns = discover::pod_netns(&s.proc_dir, &s.netns_dir, uid)
        .ok_or_else(|| format!("its network namespace was not found under {} (is the agent's /proc the host's?)", s.netns_dir.display()))?;
    Ok((netns, ip))
}

/// Takes one enrolment step; a failed one is logged and retried at the
/// next pass.
fn apply(s: &Settings, capture: &mut Capture, key: &str, e: &mut Entry, step: Option<Step>, path: CapturePath) {
    let probes = s.probes.then_some(capture::PROBE_SOURCE);
    let dp_key = datapath_key(key);
    let pod = |meshed| datapath::Pod { key: &dp_key, netns: &e.netns, ip: e.ip, node: 0, meshed };
    match step {
        None => {}
        Some(Step::Admit) => {
            tracing::info!(pod = %key, netns = %e.netns.display(), ip = %e.ip, "enrolling in the mesh: the node proxy first, then capture");
            e.state.meshed = true;
        }
        Some(Step::Capture) => match capture.set_meshed(&pod(true), path.nftables, probes) {
            Ok(()) => {
                e.state.captured = true;
                tracing::info!(pod = %key, "in the mesh: its connections are captured");
            }
            Err(err) => tracing::warn!(pod = %key, "capture: {err} (retried)"),
        },
        Some(Step::Release) => match capture.release(&pod(false)) {
            Ok(()) => {
                e.state = State::default();
                tracing::info!(pod = %key, "left the mesh without a restart: capture off, the node proxy lets it go");
            }
            Err(err) if !e.netns.exists() => {
                e.state = State::default();
                tracing::info!(pod = %key, "left the mesh (its namespace is gone: {err})");
            }
            Err(err) => tracing::warn!(pod = %key, "releasing: {err} (retried)"),
        },
        Some(Step::Forget) => e.state.meshed = false,
    }
}
