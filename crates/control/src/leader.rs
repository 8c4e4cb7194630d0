//! Leader election on a `coordination.k8s.io/v1` Lease (`--leader-elect
//! NAMESPACE/NAME`): of the control plane's replicas only the one holding
//! the Lease runs the gateway controller; every replica serves xDS and
//! certificates.
//!
//! Our own small elector rather than a crate: kube-rs 1.1 has none, and
//! the crates that do (kube-leader-election, kube-lease-manager) each pin
//! a kube version of their own and judge expiry by comparing the holder's
//! `renewTime` with the local clock, which skewed node clocks defeat. Here
//! the decision is pure ([`decide`]: expiry by this replica's own clock,
//! from when it saw the record change) and the I/O is a get followed by a
//! create or a replace carrying the `resourceVersion` read: of two
//! replicas writing the same version one gets 409 Conflict and reads
//! again.
//!
//! The leader renews every `renew_every`; a replica that does not lead
//! tries every `retry_every`; a leader that could not renew for
//! `renew_deadline` (shorter than the lease) steps down before anyone may
//! take over. On a clean stop ([`Leadership::release`]) the leader gives
//! the Lease up, so another replica takes over within `retry_every`;
//! a replica that dies is replaced once its lease has run out.

pub mod decide;

use crate::namespaced::NamespacedName;
use decide::{decide, observe, still_leading, Record, Seen, Step};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// The elector's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderSettings {
    /// How long a Lease holds without renewal (written into it, whole
    /// seconds, at least one).
    pub lease_duration: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a replica that does not lead tries to take the Lease.
    pub retry_every: Duration,
    /// How long a leader that cannot renew keeps leading.
    pub renew_deadline: Duration,
}

impl Default for LeaderSettings {
    fn default() -> Self {
        LeaderSettings::new(Duration::from_secs(15), Duration::from_secs(5), Duration::from_secs(2))
    }
}

impl LeaderSettings {
    /// The renew deadline is two thirds of the lease (10 s of 15 s, as
    /// client-go's defaults).
    pub fn new(lease_duration: Duration, renew_every: Duration, retry_every: Duration) -> LeaderSettings {
        LeaderSettings { lease_duration, renew_every, retry_every, renew_deadline: lease_duration * 2 / 3 }
    }

    /// Refuses timings under which two replicas could lead at once or the
    /// leader would lose the Lease while renewing on time.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(format!("the lease duration ({:?}) must be at least 1s", self.lease_duration));
        }
        if self.renew_every.is_zero() || self.retry_every.is_zero() {
            return Err("the renew and retry periods must not be zero".into());
        }
        if self.renew_every >= self.renew_deadline {
            return Err(format!(
                "renewing every {:?} cannot keep a lease of {:?}: renew at most every {:?} (the deadline, two thirds of the lease)",
                self.renew_every, self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs_f64().ceil() as u64).unwrap_or(i32::MAX).max(1)
    }
}

/// The flags of the election, for `slipstream control`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct LeaderArgs {
    /// Kubernetes: run the gateway controller only while this replica holds
    /// the coordination.k8s.io/v1 Lease NAMESPACE/NAME (created if absent),
    /// so that replicas never fight over a waypoint's objects. Every
    /// replica serves xDS and certificates either way.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub leader_elect: Option<NamespacedName>,
    /// This replica's name in the Lease (default: the host name, which is
    /// a pod's name).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
    /// How long the Lease holds without renewal: a replica that died is
    /// replaced after it. The leader steps down when it could not renew
    /// for two thirds of it.
    #[arg(long, default_value = "15s", value_parser = slipstream_core::duration::parse_flag)]
    pub leader_elect_lease_duration: Duration,
    /// How often the leader renews the Lease.
    #[arg(long, default_value = "5s", value_parser = slipstream_core::duration::parse_flag)]
    pub leader_elect_renew: Duration,
    /// How often a replica that does not lead tries to take the Lease.
    #[arg(long, default_value = "2s", value_parser = slipstream_core::duration::parse_flag)]
    pub leader_elect_retry: Duration,
}

impl LeaderArgs {
    /// The elector's timing from the flags.
    pub fn settings(&self) -> LeaderSettings {
        LeaderSettings::new(self.leader_elect_lease_duration, self.leader_elect_renew, self.leader_elect_retry)
    }
}

/// Who this replica is in the Lease: `POD_NAME`'s value (given), else the
/// host name (a pod's host name is its name).
pub fn identity(given: Option<&str>) -> String {
    if let Some(g) = given.filter(|g| !g.is_empty()) {
        return g.to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("slipstream-control-{}", std::process::id()))
}

/// The election, running: whether this replica leads now.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Leadership {
    /// Starts electing on `lease` as `me`.
    pub fn start(client: kube::Client, lease: &NamespacedName, me: String, settings: LeaderSettings) -> Leadership {
        let (tx, leading) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let elector = Elector {
            api: Api::namespaced(client, &lease.namespace),
            lease: lease.clone(),
            me,
            settings,
            seen: None,
            last_renewed: None,
            leading: tx,
        };
        Leadership { leading, stop: Some(stop), task: Some(tokio::spawn(elector.run(stopped))) }
    }

    /// Follows who leads: true while this replica does. Closed once the
    /// election has stopped.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Stops electing and gives the Lease up if this replica holds it
    /// (another replica then takes over at its next try).
    pub async fn release(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Leadership {
    /// Without [`Leadership::release`]: the election stops, the Lease is
    /// left to run out.
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// What one round came to.
enum Round {
    Leading,
    Following {
        holder: String,
    },
    /// 409: someone wrote the Lease since it was read.
    Conflict,
}

struct Elector {
    api: Api<Lease>,
    lease: NamespacedName,
    me: String,
    settings: LeaderSettings,
    seen: Option<Seen>,
    last_renewed: Option<Instant>,
    leading: watch::Sender<bool>,
}

fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity,
        duration: spec.lease_duration_seconds.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        renew_time: spec.renew_time.map(|t| t.0.to_rfc3339()),
    }
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::chrono::Utc::now())
}

impl Elector {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) {
        let mut failing = false;
        loop {
            match self.round().await {
                Ok(Round::Leading) => {
                    failing = false;
                    self.last_renewed = Some(Instant::now());
                    self.set_leading(true, None);
                }
                Ok(Round::Following { holder }) => {
                    failing = false;
                    self.set_leading(false, Some(&holder));
                }
                // Read again at once.
                Ok(Round::Conflict) => continue,
                Err(e) => {
                    if !failing {
                        tracing::warn!(lease = %self.lease, "leader election: cannot read or write the Lease (retrying): {e}");
                    }
                    failing = true;
                    let renewed = self.last_renewed.is_some_and(|t| still_leading(t, Instant::now(), self.settings.renew_deadline));
                    if *self.leading.borrow() && !renewed {
                        tracing::warn!(lease = %self.lease, "leader election: could not renew for {:?}: stepping down", self.settings.renew_deadline);
                        self.set_leading(false, None);
                    }
                }
            }
            let pause = if *self.leading.borrow() { self.settings.renew_every } else { self.settings.retry_every };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = &mut stopped => break,
            }
        }
        if *self.leading.borrow() {
            self.set_leading(false, None);
            self.give_up().await;
        }
    }

    fn set_leading(&self, now: bool, holder: Option<&str>) {
        let was = self.leading.send_replace(now);
        match (was, now) {
            (false, true) => tracing::info!(lease = %self.lease, identity = %self.me, "leader election: became leader"),
            (true, false) => match holder {
                Some(h) => tracing::info!(lease = %self.lease, identity = %self.me, "leader election: lost the lease to {h}"),
                None => tracing::info!(lease = %self.lease, identity = %self.me, "leader election: no longer the leader"),
            },
            _ => {}
        }
    }

    /// Reads the Lease and does what the decision says.
    async fn round(&mut self) -> Result<Round, kube::Error> {
        let read = self.api.get_opt(&self.lease.name).await?;
        let now = Instant::now();
        self.seen = read.as_ref().map(|l| observe(self.seen.take(), record_of(l), now));
        let step = decide(self.seen.as_ref(), now, &self.me, self.settings.lease_duration);
        let written = match (step, read) {
            (Step::Wait { holder }, _) => return Ok(Round::Following { holder }),
            (Step::Create, _) => {
                let mut lease = Lease { spec: Some(self.spec(None, true)), ..Lease::default() };
                lease.metadata.name = Some(self.lease.name.clone());
                self.api.create(&PostParams::default(), &lease).await
            }
            (Step::Take | Step::Renew, Some(mut lease)) => {
                let held = lease.spec.take();
                let acquired = !*self.leading.borrow() || held.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(&self.me);
                lease.spec = Some(self.spec(held, acquired));
                // Carries the resourceVersion read: a write in between is a 409.
                self.api.replace(&self.lease.name, &PostParams::default(), &lease).await
            }
            // (Not decided without a Lease read: read again.)
            (Step::Take | Step::Renew, None) => return Ok(Round::Conflict),
        };
        match written {
            Ok(_) => Ok(Round::Leading),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::Conflict),
            Err(e) => Err(e),
        }
    }

    /// The spec this replica writes, from `held` (the one read): renewed,
    /// and when `acquired`, taken now (one more transition if it changes
    /// hands).
    fn spec(&self, held: Option<LeaseSpec>, acquired: bool) -> LeaseSpec {
        let held = held.unwrap_or_default();
        let now = now_micro();
        let changes_hands = held.holder_identity.as_deref().is_some_and(|h| !h.is_empty() && h != self.me);
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.settings.duration_secs()),
            acquire_time: if acquired { Some(now.clone()) } else { held.acquire_time.clone() },
            renew_time: Some(now),
            lease_transitions: Some(held.lease_transitions.unwrap_or(0) + i32::from(changes_hands)),
            ..held
        }
    }

    /// Gives the Lease up (no holder), if this replica still holds it.
    async fn give_up(&self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.lease.name).await? else { return Ok(()) };
            let mut spec = lease.spec.take().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(&self.me) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now_micro());
            lease.spec = Some(spec);
            self.api.replace(&self.lease.name, &PostParams::default(), &lease).await.map(|_| ())
        };
        match tokio::time::timeout(Duration::from_secs(5), result).await {
            Ok(Ok(())) => tracing::info!(lease = %self.lease, "leader election: released the lease"),
            Ok(Err(e)) => tracing::warn!(lease = %self.lease, "leader election: could not release the lease (it runs out instead): {e}"),
            Err(_) => tracing::warn!(lease = %self.lease, "leader election: releasing the lease timed out (it runs out instead)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        let d = LeaderSettings::default();
        assert_eq!(d.renew_deadline, Duration::from_secs(10));
        assert_eq!(d.duration_secs(), 15);
        assert_eq!(d.check(), Ok(()));
        assert!(LeaderSettings::new(Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2)).check().is_err());
        assert!(LeaderSettings::new(Duration::from_millis(500), Duration::from_millis(100), Duration::from_millis(100)).check().is_err());
        assert_eq!(
            LeaderSettings::new(Duration::from_millis(1500), Duration::from_millis(300), Duration::from_millis(100)).duration_secs(),
            2
        );
    }

    #[test]
    fn flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            leader: LeaderArgs,
        }
        let parse = |args: &[&str]| Cmd::try_parse_from(std::iter::once("control").chain(args.iter().copied())).map(|c| c.leader);
        let off = parse(&[]).unwrap();
        assert_eq!((off.leader_elect.clone(), off.settings()), (None, LeaderSettings::default()));
        let on = parse(&[
            "--leader-elect",
            "slipstream-system/slipstream-control",
            "--leader-elect-identity",
            "pod-a",
            "--leader-elect-retry",
            "1s",
        ])
        .unwrap();
        assert_eq!(on.leader_elect, Some(NamespacedName::new("slipstream-system", "slipstream-control")));
        assert_eq!(on.leader_elect_identity.as_deref(), Some("pod-a"));
        assert_eq!(on.settings().retry_every, Duration::from_secs(1));
        assert!(parse(&["--leader-elect", "no-namespace"]).is_err());
    }

    #[test]
    fn identity_prefers_the_pod_name() {
        assert_eq!(identity(Some("slipstream-control-7d9f-abcde")), "slipstream-control-7d9f-abcde");
        assert!(!identity(None).is_empty());
        assert!(!identity(Some("")).is_empty());
    }
}
