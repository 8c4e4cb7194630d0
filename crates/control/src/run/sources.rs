//! Where objects come from, as batches of events: a directory of manifests
//! (polled on a thread, woken by inotify) or the Kubernetes API (watchers,
//! read whole before the control plane serves), with the authenticator
//! that goes with each.

use super::{ControlArgs, SourceArg, WaypointPods};
use crate::auth::{Authenticator, NodeTokens};
use crate::ca::{ReviewPolicy, TokenReviewAuthenticator};
use crate::gateway::controller::Mirror;
use crate::objects::{self, Kind, ObjectRef};
use crate::source::dir::DirSource;
use crate::source::kube::{self as kube_source, RawEvent};
use crate::source::ObjectEvent;
use anyhow::bail;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The object source of `start`, and what comes with it.
pub(super) struct Sources {
    pub(super) batches: mpsc::Receiver<Batch>,
    /// The kubernetes source's task (its watchers end with it).
    pub(super) task: Option<JoinHandle<()>>,
    /// Who calls: the local cluster's tokens, or TokenReview.
    pub(super) auth: Arc<dyn Authenticator>,
    /// Kubernetes, with the gateway controller: its client and the mirror
    /// of the objects it reads.
    pub(super) gateway_client: Option<(kube::Client, Arc<Mirror>)>,
    /// Kubernetes: the API server's client (the CA's Secret, the published
    /// roots, the leader election).
    pub(super) client: Option<kube::Client>,
}

/// The source `args` name: a directory (with the local cluster's tokens)
/// or the Kubernetes API (with its tokens, else TokenReview, which lets
/// the waypoints' pods in `waypoint_pods` obtain their own identity).
pub(super) async fn build_sources(
    args: &ControlArgs,
    node_tokens: Option<NodeTokens>,
    waypoint_pods: WaypointPods,
) -> anyhow::Result<Sources> {
    match &args.source {
        SourceArg::Dir(root) => {
            let Some(tokens) = &args.node_tokens else {
                bail!("--source dir: needs --node-tokens (there is no API server to review tokens)")
            };
            tracing::info!(dir = %root.display(), "objects from a directory");
            let workloads = args.workload_tokens.as_deref().map(|p| crate::auth::WorkloadTokens::new(p, &args.trust_domain));
            Ok(Sources {
                batches: dir_source(root.clone(), args.dir_interval),
                task: None,
                auth: Arc::new(crate::auth::LocalTokens { nodes: NodeTokens::load(tokens)?, workloads }),
                gateway_client: None,
                client: None,
            })
        }
        SourceArg::Kubernetes => {
            let client = kube_source::client(args.kubeconfig.as_deref()).await?;
            let auth: Arc<dyn Authenticator> = match node_tokens {
                Some(t) => Arc::new(t),
                None => {
                    let policy = ReviewPolicy { trust_domain: args.trust_domain.clone(), ..args.ca.review_policy()? };
                    Arc::new(TokenReviewAuthenticator::new(client.clone(), policy).with_waypoints(waypoint_pods))
                }
            };
            tracing::info!("objects from the Kubernetes API");
            let mirror = args.gateway_controller.then(|| Arc::new(Mirror::default()));
            let gateway_client = mirror.as_ref().map(|m| (client.clone(), m.clone()));
            let (batches, task) = kube_batches(client.clone(), mirror, &args.root_namespace);
            Ok(Sources { batches, task: Some(task), auth, gateway_client, client: Some(client) })
        }
    }
}

/// The `.generation` counter the local cluster's agent writes with its objects.
fn read_marker(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join(".generation")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// A batch of events from a source, with the objects generation they cover.
pub(super) struct Batch {
    pub(super) events: Vec<ObjectEvent>,
    pub(super) objects_generation: u64,
    /// The source has now been read whole at least once.
    pub(super) synced: bool,
}

fn dir_source(root: PathBuf, every: Duration) -> mpsc::Receiver<Batch> {
    let (tx, rx) = mpsc::channel(4);
    let mut dir = DirSource::new(root.clone());
    std::thread::Builder::new()
        .name("dir-source".into())
        .spawn(move || {
            let mut was_there = true;
            loop {
                // The marker first: every file written before it is then
                // included in this poll.
                let objects_generation = read_marker(&root);
                let events = dir.poll().into_iter().map(|(e, _)| e).collect();
                // A directory that is not there (a wrong path, not created
                // yet, removed) says nothing: never that every object is
                // gone, or proxies would be told that everything they hold
                // was removed. Said once each time it goes or comes back.
                let there = root.is_dir();
                match (was_there, there) {
                    (true, false) => tracing::warn!(
                        dir = %root.display(),
                        "the object directory does not exist; serving what was read before, if anything (not serving until it was read once)"
                    ),
                    (false, true) => tracing::info!(dir = %root.display(), "the object directory is there again"),
                    _ => {}
                }
                was_there = there;
                if tx.blocking_send(Batch { events, objects_generation, synced: there }).is_err() {
                    return;
                }
                // Until a file changes (inotify), or `every` at the latest.
                dir.wait(every);
            }
        })
        .expect("spawning the directory source");
    rx
}

/// How long the initial read waits for custom kinds that are neither
/// listed nor known to be absent (their watch fails otherwise: RBAC, a
/// broken conversion webhook) before serving without them.
const CUSTOM_KINDS_WAIT: Duration = Duration::from_secs(15);

/// Which kinds have been read whole: the source counts as read once every
/// built-in kind has listed and every custom kind has listed or is not
/// served (its CRD not installed); a custom kind still failing after
/// [`CUSTOM_KINDS_WAIT`] is given up on, with a warning. Built-in kinds are
/// never given up on: serving without pods would tell every proxy that
/// reconnects that its workloads were removed.
#[derive(Default)]
struct InitialRead {
    done: BTreeSet<&'static str>,
    warned: bool,
}

impl InitialRead {
    fn listed(&mut self, kind: &'static str) {
        self.done.insert(kind);
    }

    fn complete(&mut self, waited: Duration) -> bool {
        let missing = |custom: bool| -> Vec<&'static str> {
            kube_source::KINDS.iter().filter(|k| k.custom == custom && !self.done.contains(k.kind)).map(|k| k.kind).collect()
        };
        let (builtin, custom) = (missing(false), missing(true));
        if waited < CUSTOM_KINDS_WAIT || self.warned {
            return builtin.is_empty() && (custom.is_empty() || self.warned);
        }
        self.warned = true;
        if !builtin.is_empty() {
            tracing::warn!(
                "not serving yet: {} not listed after {CUSTOM_KINDS_WAIT:?} (see the watch errors above){}",
                builtin.join(", "),
                if custom.is_empty() { String::new() } else { format!("; nor {}", custom.join(", ")) }
            );
            return false;
        }
        if !custom.is_empty() {
            tracing::warn!(
                "serving without {}: not listed after {CUSTOM_KINDS_WAIT:?} (see the watch errors above); they are added when their watch succeeds",
                custom.join(", ")
            );
        }
        true
    }
}

/// The kubernetes source as batches, and its task: it ends, with every
/// watcher and its connection to the API server, once the receiver is
/// dropped.
fn kube_batches(client: kube::Client, mirror: Option<Arc<Mirror>>, root_namespace: &str) -> (mpsc::Receiver<Batch>, JoinHandle<()>) {
    let (raw_tx, raw_rx) = mpsc::channel(1024);
    let watchers = kube_source::spawn(client, raw_tx, root_namespace);
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(async move {
        kube_read(raw_rx, tx, mirror).await;
        for w in &watchers {
            w.abort();
        }
        for w in watchers {
            let _ = w.await;
        }
    });
    (rx, task)
}

/// Turns the watchers' events into batches of objects until `tx` closes.
/// The gateway controller's `mirror`, if any, sees every event first.
async fn kube_read(mut raw_rx: mpsc::Receiver<RawEvent>, tx: mpsc::Sender<Batch>, mirror: Option<Arc<Mirror>>) {
    let mut known: BTreeMap<&'static str, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut initial = InitialRead::default();
    let started = tokio::time::Instant::now();
    let mut synced = false;
    loop {
        // Until the source is read whole, wake up at the deadline even
        // if nothing arrives: kinds that fail send nothing.
        let first = tokio::select! {
            ev = raw_rx.recv() => match ev {
                Some(ev) => Some(ev),
                None => return,
            },
            _ = tokio::time::sleep_until(started + CUSTOM_KINDS_WAIT), if !synced && !initial.warned => None,
            _ = tx.closed() => return,
        };
        let mut raw: Vec<RawEvent> = first.into_iter().collect();
        while let Ok(more) = raw_rx.try_recv() {
            raw.push(more);
            if raw.len() >= 4096 {
                break;
            }
        }
        let mut events = Vec::new();
        for ev in raw {
            if let Some(m) = &mirror {
                m.observe(&ev);
            }
            match ev {
                RawEvent::Apply(v) => match objects::parse_value(v) {
                    Ok(Some(o)) => {
                        let r = o.object_ref();
                        known.entry(r.kind.as_str()).or_default().insert((r.namespace.clone(), r.name.clone()));
                        events.push(ObjectEvent::Upsert(o));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::error!("refused, its last good version stays in force: {e}"),
                },
                RawEvent::Delete { kind, namespace, name } => {
                    if let Some(k) = Kind::ALL.into_iter().find(|k| k.as_str() == kind) {
                        known.entry(k.as_str()).or_default().remove(&(namespace.clone(), name.clone()));
                        events.push(ObjectEvent::Delete(ObjectRef::new(k, &namespace, &name)));
                    }
                }
                RawEvent::Relisted { kind, present } => {
                    initial.listed(kind);
                    if let Some(k) = Kind::ALL.into_iter().find(|k| k.as_str() == kind) {
                        let held = known.entry(k.as_str()).or_default();
                        for (ns, name) in held.difference(&present).cloned().collect::<Vec<_>>() {
                            held.remove(&(ns.clone(), name.clone()));
                            events.push(ObjectEvent::Delete(ObjectRef::new(k, &ns, &name)));
                        }
                    }
                }
                // Nothing of the kind can exist, so there is nothing to
                // wait for. What is held of it stays: a CRD's objects
                // are deleted (and their deletions watched) before the
                // CRD goes, so a 404 while holding some is an API
                // server's passing state, not a deletion.
                RawEvent::Absent { kind } => initial.listed(kind),
            }
        }
        synced = synced || initial.complete(started.elapsed());
        if tx.send(Batch { events, objects_generation: 0, synced }).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn list(r: &mut InitialRead, custom: bool) {
        for k in kube_source::KINDS.iter().filter(|k| k.custom == custom) {
            r.listed(k.kind);
        }
    }

    #[test]
    fn absent_custom_kinds_are_not_waited_for_and_builtin_kinds_always_are() {
        let early = Duration::from_secs(1);
        let late = CUSTOM_KINDS_WAIT;

        // Built-in kinds listed, the custom ones reported absent: at once.
        let mut r = InitialRead::default();
        list(&mut r, false);
        assert!(!r.complete(early), "custom kinds neither listed nor absent yet");
        list(&mut r, true);
        assert!(r.complete(early));

        // Custom kinds that keep failing: served without them after the wait.
        let mut r = InitialRead::default();
        list(&mut r, false);
        assert!(!r.complete(early));
        assert!(r.complete(late));

        // Built-in kinds that keep failing: never served without them.
        let mut r = InitialRead::default();
        list(&mut r, true);
        assert!(!r.complete(late));
        assert!(!r.complete(late * 10));
        list(&mut r, false);
        assert!(r.complete(late * 10));
    }

    /// The watchers hold the client (and its connections); they end once
    /// the control plane drops its receiver of batches.
    #[tokio::test]
    async fn dropping_the_batches_ends_the_watchers() {
        let alive = Arc::new(());
        let held = alive.clone();
        // An API server that never answers: every watcher waits on it.
        let api = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let request = held.clone();
            async move {
                let _request = request;
                std::future::pending::<()>().await;
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
            }
        });
        let (batches, task) = kube_batches(kube::Client::new(api, "default"), None, "istio-system");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&alive) < 2 + kube_source::KINDS.len() {
            assert!(Instant::now() < deadline, "the watchers did not ask the API server");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(batches);
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("the source ends").unwrap();
        while Arc::strong_count(&alive) > 1 {
            assert!(Instant::now() < deadline, "{} requests or clients left", Arc::strong_count(&alive) - 1);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
