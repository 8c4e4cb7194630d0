//! The elector's decision, no I/O: given the Lease as last read, when this
//! replica saw its record change, the time now and who this replica is,
//! what to do.
//!
//! Expiry is judged by this replica's own clock, from when it saw the
//! record last change (as client-go does), never by comparing the
//! holder's `renewTime` with the local clock: replicas on nodes whose
//! clocks differ still agree on when a lease ran out.

use std::time::{Duration, Instant};

/// What of a Lease the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Empty or absent: released.
    pub holder: Option<String>,
    /// The holder's `leaseDurationSeconds`.
    pub duration: Option<Duration>,
    /// The holder's `renewTime` as written (compared, never interpreted).
    pub renew_time: Option<String>,
}

/// A record and when this replica saw it change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub record: Record,
    pub changed_at: Instant,
}

/// The record just read, after `prev`: the time of change is kept while
/// the record stays the same (a holder that stops renewing leaves it so).
pub fn observe(prev: Option<Seen>, record: Record, now: Instant) -> Seen {
    match prev {
        Some(p) if p.record == record => p,
        _ => Seen { record, changed_at: now },
    }
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is no Lease: create it, holding it.
    Create,
    /// Released or expired: take it (`resourceVersion` as read).
    Take,
    /// This replica holds it: renew it.
    Renew,
    /// Another replica holds it and it has not expired.
    Wait { holder: String },
}

/// `seen`: the Lease as last read (None: there is none). `default`: the
/// lease duration when the record has none.
pub fn decide(seen: Option<&Seen>, now: Instant, me: &str, default: Duration) -> Step {
    let Some(seen) = seen else { return Step::Create };
    match seen.record.holder.as_deref().filter(|h| !h.is_empty()) {
        None => Step::Take,
        Some(h) if h == me => Step::Renew,
        Some(h) => {
            let lasts = seen.record.duration.unwrap_or(default);
            if now.saturating_duration_since(seen.changed_at) >= lasts {
                Step::Take
            } else {
                Step::Wait { holder: h.to_string() }
            }
        }
    }
}

/// A leader that could not renew since `last_renewed` still leads until
/// `deadline` (shorter than the lease: it stops before anyone may take
/// over).
pub fn still_leading(last_renewed: Instant, now: Instant, deadline: Duration) -> bool {
    now.saturating_duration_since(last_renewed) < deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(holder: Option<&str>, secs: Option<u64>, renew: &str) -> Record {
        Record { holder: holder.map(String::from), duration: secs.map(Duration::from_secs), renew_time: Some(renew.into()) }
    }

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let seen = |r: Record, at: Instant| Some(Seen { record: r, changed_at: at });
        let wait = |h: &str| Step::Wait { holder: h.into() };
        #[rustfmt::skip]
        let cases: Vec<(&str, Option<Seen>, Instant, Step)> = vec![
            ("no lease", None, t0, Step::Create),
            ("released (no holder)", seen(rec(None, Some(15), "a"), t0), t0, Step::Take),
            ("released (empty holder)", seen(rec(Some(""), Some(1), "a"), t0), t0, Step::Take),
            ("mine", seen(rec(Some("me"), Some(15), "a"), t0), t0 + s(100), Step::Renew),
            ("another's, fresh", seen(rec(Some("b"), Some(15), "a"), t0), t0 + s(14), wait("b")),
            ("another's, expired", seen(rec(Some("b"), Some(15), "a"), t0), t0 + s(15), Step::Take),
            ("another's, its own duration", seen(rec(Some("b"), Some(2), "a"), t0), t0 + s(2), Step::Take),
            ("another's, no duration: the default", seen(rec(Some("b"), None, "a"), t0), t0 + s(9), wait("b")),
            ("another's, no duration, expired", seen(rec(Some("b"), None, "a"), t0), t0 + s(10), Step::Take),
        ];
        for (what, seen, now, want) in cases {
            assert_eq!(decide(seen.as_ref(), now, "me", s(10)), want, "{what}");
        }
    }

    #[test]
    fn expiry_counts_from_the_last_change_seen() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let first = observe(None, rec(Some("b"), Some(15), "r1"), t0);
        // Read again, unchanged: the holder has not renewed since t0.
        let same = observe(Some(first.clone()), rec(Some("b"), Some(15), "r1"), t0 + s(10));
        assert_eq!(same.changed_at, t0);
        assert_eq!(decide(Some(&same), t0 + s(15), "me", s(15)), Step::Take);
        // Renewed (its clock may be far from ours: only the change counts).
        let renewed = observe(Some(same), rec(Some("b"), Some(15), "r0-earlier-clock"), t0 + s(12));
        assert_eq!(renewed.changed_at, t0 + s(12));
        assert_eq!(decide(Some(&renewed), t0 + s(15), "me", s(15)), Step::Wait { holder: "b".into() });
    }

    #[test]
    fn a_leader_that_cannot_renew_steps_down_at_the_deadline() {
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(still_leading(t0, t0 + Duration::from_secs(9), d));
        assert!(!still_leading(t0, t0 + d, d));
    }
}
