//! How long and how hard each experiment runs: the full profile of
//! BENCHMARKS.md, or `--quick` (a smoke test that every experiment produces
//! numbers, in well under two minutes).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub quick: bool,
    pub reps: u32,
    /// T1 and T2 (iperf3 `-t`).
    pub throughput_secs: u32,
    /// L1 (fortio `-t`).
    pub latency_secs: u32,
    /// Q1.
    pub max_rate_secs: u32,
    /// C1. Short enough that the client's TIME_WAIT sockets of one run stay
    /// well below the ephemeral port range (28k ports, 60 s).
    pub connect_secs: u32,
    /// fortio `-c` for L1, Q1 and C1.
    pub concurrency: u32,
    /// fortio `-qps` for L1.
    pub latency_qps: u32,
    /// `/echo?size=N`.
    pub payload: u32,
    /// R1: connections held open through the mesh.
    pub hold_connections: usize,
    /// R1: how long they are held before the proxies' memory is read.
    pub hold_settle_ms: u64,
    /// Between two R1 repetitions of a scenario: TCP's TIME_WAIT (60 s on
    /// Linux), so that the proxies' sockets of the previous 10k connections
    /// are gone and cannot collide with the next ones.
    pub hold_cooldown_ms: u64,
    /// S1 (Kubernetes): pods started per repetition, one after the other.
    #[serde(default = "default_pod_starts")]
    pub pod_starts: u32,
    /// Pause between steps (iperf3's server takes a moment to accept the
    /// next test; CPU caches and timers settle).
    pub pause_ms: u64,
}

/// BENCHMARKS.md: pod start's p50 and p99 over 50 pods.
fn default_pod_starts() -> u32 {
    50
}

impl Settings {
    pub fn full() -> Settings {
        Settings {
            quick: false,
            reps: 3,
            throughput_secs: 10,
            latency_secs: 30,
            max_rate_secs: 30,
            connect_secs: 5,
            concurrency: 64,
            latency_qps: 1000,
            payload: 1024,
            hold_connections: 10_000,
            hold_settle_ms: 2000,
            hold_cooldown_ms: 61_000,
            pod_starts: default_pod_starts(),
            pause_ms: 1000,
        }
    }

    pub fn quick() -> Settings {
        Settings {
            quick: true,
            reps: 1,
            throughput_secs: 2,
            latency_secs: 3,
            max_rate_secs: 3,
            connect_secs: 2,
            hold_connections: 1000,
            hold_settle_ms: 500,
            pod_starts: 5,
            pause_ms: 300,
            ..Settings::full()
        }
    }

    /// The profile with the user's overrides.
    pub fn resolve(quick: bool, reps: Option<u32>, hold_connections: Option<usize>) -> Result<Settings, String> {
        let mut s = if quick { Settings::quick() } else { Settings::full() };
        if let Some(r) = reps {
            if r == 0 {
                return Err("--reps must be at least 1".into());
            }
            s.reps = r;
        }
        if let Some(n) = hold_connections {
            if n == 0 {
                return Err("--hold-connections must be at least 1".into());
            }
            s.hold_connections = n;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::{estimate, EXPERIMENTS};
    use std::time::Duration;

    #[test]
    fn quick_run_fits_in_two_minutes_and_full_in_twenty_five() {
        assert!(
            estimate(&Settings::quick(), 2, &EXPERIMENTS) < Duration::from_secs(90),
            "{:?}",
            estimate(&Settings::quick(), 2, &EXPERIMENTS)
        );
        assert!(
            estimate(&Settings::full(), 2, &EXPERIMENTS) < Duration::from_secs(25 * 60),
            "{:?}",
            estimate(&Settings::full(), 2, &EXPERIMENTS)
        );
    }

    #[test]
    fn full_profile_is_the_one_of_benchmarks_md() {
        let s = Settings::full();
        assert_eq!((s.throughput_secs, s.latency_secs, s.max_rate_secs), (10, 30, 30));
        assert_eq!((s.concurrency, s.latency_qps, s.payload, s.hold_connections), (64, 1000, 1024, 10_000));
    }

    #[test]
    fn overrides() {
        let s = Settings::resolve(true, Some(2), None).unwrap();
        assert!(s.quick);
        assert_eq!((s.reps, s.hold_connections), (2, 1000));
        assert_eq!(Settings::resolve(false, None, Some(500)).unwrap().hold_connections, 500);
        assert!(Settings::resolve(false, Some(0), None).is_err());
        assert!(Settings::resolve(false, None, Some(0)).is_err());
    }
}
