//! The pods controller (the kubelet's role): makes the pods that run match
//! the pods the objects ask for, level-triggered. It places new pods on
//! nodes and gives them addresses, creates their sandboxes (network
//! namespace, veth, cgroup, files; put on the datapath through `enrol`),
//! supervises their containers (`pods::PodRuntime`), rolls Deployments out
//! surge-first, keeps each pod's hosts and resolv.conf current, enrols and
//! releases running pods as their labels change, and stops them
//! gracefully.

use super::datapath::Capture;
use super::enrol;
use super::flows::PodName;
use super::mesh;
use super::node::Node;
use super::pods::PodRuntime;
use super::store::Store;
use crate::names::Paths;
use crate::plan::{self, HostsEntry};
use crate::status::PodStatus;
use slipstream_k8s::{desired_pods, PodInstance};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// How long a pod may take to stop when deleted (Kubernetes' grace period,
/// capped so that `delete` and `down` stay quick).
pub const MAX_GRACE: Duration = Duration::from_secs(10);

type Key = (String, String);

#[derive(Default)]
pub struct Kubelet {
    running: BTreeMap<Key, PodRuntime>,
    /// Pods being stopped (a replaced pod may reuse its name meanwhile).
    stopping: Vec<PodRuntime>,
    /// Pods that could not be placed, reported once each (not every tick).
    unplaceable: BTreeSet<Key>,
    /// The service names as last written into the hosts files.
    last_hosts: Option<Vec<HostsEntry>>,
}

/// What a new waypoint pod gets: its token and environment.
pub type WaypointCredentials<'a> = &'a dyn Fn() -> (String, Vec<(String, String)>);

impl Kubelet {
    /// The pods that run (not those being stopped).
    pub fn running(&self) -> Vec<&PodRuntime> {
        self.running.values().collect()
    }

    /// Every pod, those being stopped included.
    pub fn all(&self) -> Vec<&PodRuntime> {
        self.running.values().chain(self.stopping.iter()).collect()
    }

    /// Stops pods no longer wanted (or whose spec changed), creates the
    /// missing ones.
    pub fn reconcile(&mut self, paths: &Paths, store: &Store, nodes: &[Node], capture: &mut Capture, waypoint: WaypointCredentials) {
        let desired = desired_pods(store.objects());
        self.unplaceable.retain(|k| desired.iter().any(|p| p.namespace == k.0 && p.name == k.1));
        self.stop_stale(&desired);
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        for inst in desired {
            let key = (inst.namespace.clone(), inst.name.clone());
            // A pod replaced under the same name waits for the old one.
            if self.running.contains_key(&key) || self.stopping.iter().any(|p| p.inst.namespace == key.0 && p.inst.name == key.1) {
                continue;
            }
            let loads: Vec<usize> = nodes.iter().map(|n| self.running.values().filter(|p| p.node == n.index).count()).collect();
            let Ok(pos) = plan::place(&names, &loads, inst.spec.node_name.as_deref()) else { continue };
            let node = &nodes[pos];
            let used: BTreeSet<Ipv4Addr> = self.all().iter().map(|p| p.ip).collect();
            let Some(ip) = plan::next_pod_ip(node.index, &used) else {
                // Retried every tick: said once per pod.
                if self.unplaceable.insert(key.clone()) {
                    tracing::error!(node = %node.name, "no pod address left for {}/{}; it waits until one is free", key.0, key.1);
                }
                continue;
            };
            self.unplaceable.remove(&key);
            let ns_labels = mesh::namespace_labels(store, &inst.namespace);
            let meshed = mesh::is_meshed(&ns_labels, &inst.labels);
            let nft = mesh::wants_nftables(&ns_labels, &inst.labels);
            // Provenance, not labels: a pod of the Deployment the agent made
            // for a Gateway (users cannot apply one that says it is).
            let is_waypoint = inst.owner.as_deref().is_some_and(|d| store.made_for_waypoint(&inst.namespace, d));
            let mut pod = PodRuntime::create(paths, inst, node, ip, meshed, nft, capture);
            if is_waypoint {
                let (token, env) = waypoint();
                pod.extra_env = env;
                pod.workload_token = Some(token);
            }
            self.running.insert(key, pod);
        }
    }

    /// Begins stopping the pods no longer wanted as they are. A
    /// Deployment's pods of an older template stay until every pod of its
    /// current template is ready (a rolling update with all the new pods
    /// surged at once): a restarted waypoint or app keeps serving.
    fn stop_stale(&mut self, desired: &[PodInstance]) {
        let wanted: BTreeMap<Key, &PodInstance> = desired.iter().map(|p| ((p.namespace.clone(), p.name.clone()), p)).collect();
        let ready = |ns: &str, name: &str| self.running.get(&(ns.to_string(), name.to_string())).is_some_and(|p| p.ready());
        let stale: Vec<Key> = self
            .running
            .iter()
            .filter(|(k, p)| wanted.get(*k).is_none_or(|w| w.spec_hash != p.inst.spec_hash))
            .filter(|(_, p)| !plan::rollout_holds(&p.inst, desired, ready))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(mut p) = self.running.remove(&k) {
                p.stop(MAX_GRACE);
                self.stopping.push(p);
            }
        }
    }

    /// Istio ambient's enrolment of pods that already run (`enrol`): what
    /// their labels want now, and whether their node proxy serves them.
    /// Waypoint pods stay as they were made.
    pub fn sync_enrolment(&mut self, store: &Store, capture: &mut Capture, served: &dyn Fn(&PodRuntime) -> bool) {
        for p in self.running.values_mut() {
            if p.sandbox_error.is_some() || p.terminating() || p.workload_token.is_some() {
                continue;
            }
            let ns_labels = mesh::namespace_labels(store, &p.inst.namespace);
            let want = mesh::is_meshed(&ns_labels, &p.inst.labels);
            let nft = mesh::wants_nftables(&ns_labels, &p.inst.labels);
            let mut state = enrol::State { meshed: p.meshed, captured: p.captured };
            enrol::reconcile(capture, &p.enrol_ref(nft), &mut state, want, served(p));
            (p.meshed, p.captured) = (state.meshed, state.captured);
        }
    }

    /// One supervision step of every running pod; true if a readiness
    /// changed. A meshed pod starts once its node proxy serves it.
    pub fn tick(&mut self, paths: &Paths, nodes: &[Node], served: &dyn Fn(&PodRuntime) -> bool) -> bool {
        let mut changed = false;
        for p in self.running.values_mut() {
            let may_start = !p.meshed || served(p);
            changed |= p.tick(paths, nodes, may_start);
        }
        changed
    }

    /// Drives stopping pods (each leaves the datapath as it goes); true
    /// when one is gone.
    pub fn progress_stopping(&mut self, capture: &mut Capture) -> bool {
        let before = self.stopping.len();
        self.stopping.retain_mut(|p| !p.progress_stop(capture));
        before != self.stopping.len()
    }

    /// Stops every pod gracefully and waits (at most the grace period and
    /// 5 s more) for them to be gone.
    pub fn stop_all(&mut self, capture: &mut Capture) {
        for (_, mut p) in std::mem::take(&mut self.running) {
            p.stop(MAX_GRACE);
            self.stopping.push(p);
        }
        let deadline = Instant::now() + MAX_GRACE + Duration::from_secs(5);
        while !self.stopping.is_empty() && Instant::now() < deadline {
            self.progress_stopping(capture);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes each pod's hosts file when the service names changed (or it
    /// has none yet) and its resolv.conf when missing.
    pub fn write_name_files(&mut self, hosts: Vec<HostsEntry>) {
        let hosts_changed = self.last_hosts.as_ref().map(|h| format!("{h:?}")) != Some(format!("{hosts:?}"));
        for p in self.running.values() {
            if p.sandbox_error.is_some() {
                continue;
            }
            // Rewrite in place: the file is bind-mounted by inode into the
            // pod's processes, so it must never be replaced by a rename.
            if hosts_changed || !p.hosts_path().exists() {
                let text = plan::hosts_file(&p.inst.namespace, &p.inst.name, p.ip, &hosts);
                if let Err(e) = std::fs::write(p.hosts_path(), text) {
                    tracing::warn!(pod = %p.key(), "cannot write hosts: {e}");
                }
            }
            if !p.resolv_path().exists() {
                let _ = std::fs::write(p.resolv_path(), plan::resolv_conf(&p.inst.namespace));
            }
        }
        self.last_hosts = Some(hosts);
    }

    /// What `status` shows of every pod, sorted by namespace and name.
    pub fn status(&self, paths: &Paths, nodes: &[Node]) -> Vec<PodStatus> {
        let mut pods: Vec<_> = self.all().iter().map(|p| p.status(paths, nodes)).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    /// The names flow events are shown with: every pod known (so a pod
    /// deleted later still shows by name).
    pub fn flow_names(&self) -> Vec<PodName> {
        self.all()
            .iter()
            .map(|p| PodName {
                ip: p.ip,
                namespace: p.inst.namespace.clone(),
                name: p.inst.name.clone(),
                identity: if p.meshed {
                    format!(
                        "spiffe://{}/ns/{}/sa/{}",
                        slipstream_core::DEFAULT_TRUST_DOMAIN,
                        p.inst.namespace,
                        p.inst.spec.service_account()
                    )
                } else {
                    String::new()
                },
                service: false,
            })
            .collect()
    }
}
