//! The order of a run's steps, and the progress line of each. Pure.
//!
//! Repetition-major, then experiment, then scenario: the scenarios of one
//! figure are measured back to back (so slow drift of the machine affects
//! them alike), and the repetitions of one experiment are far apart (so the
//! TIME_WAIT sockets of one C1 run are gone before the next). R1's held
//! connections come last, after every repetition of the others, scenario by
//! scenario: a proxy may keep the memory they took, which would inflate the
//! peak RSS measured later (in other experiments, or in `none`'s R1, the
//! control that shows the proxies carrying nothing).

use crate::experiment::ExperimentId;
use crate::scenario::Scenario;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// 1-based position in the run.
    pub index: usize,
    pub rep: u32,
    pub experiment: ExperimentId,
    pub scenario: &'static Scenario,
}

/// Steps of `experiments` for the measurable scenarios among `scenarios`.
pub fn steps(scenarios: &[&'static Scenario], experiments: &[ExperimentId], reps: u32) -> Vec<Step> {
    let measured: Vec<&'static Scenario> = scenarios.iter().copied().filter(|s| s.available()).collect();
    let mut out = Vec::new();
    for rep in 1..=reps {
        for experiment in experiments.iter().copied().filter(|e| *e != ExperimentId::R1) {
            for scenario in &measured {
                out.push(Step { index: out.len() + 1, rep, experiment, scenario });
            }
        }
    }
    for scenario in measured.iter().filter(|_| experiments.contains(&ExperimentId::R1)) {
        for rep in 1..=reps {
            out.push(Step { index: out.len() + 1, rep, experiment: ExperimentId::R1, scenario });
        }
    }
    out
}

/// `[ 3/36] l4-nft  Q1 rep 1/3 ... `
pub fn progress_prefix(step: &Step, total: usize, reps: u32, name_width: usize) -> String {
    let w = total.to_string().len();
    format!("[{:>w$}/{total}] {:<name_width$} {} rep {}/{reps} ... ", step.index, step.scenario.name, step.experiment, step.rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::EXPERIMENTS;
    use crate::scenario::SCENARIOS;

    #[test]
    fn order_is_rep_experiment_scenario_over_measurable_scenarios() {
        let all: Vec<&'static Scenario> = SCENARIOS.iter().take(2).collect();
        assert_eq!(steps(&SCENARIOS.iter().collect::<Vec<_>>(), &EXPERIMENTS, 1).len(), EXPERIMENTS.len() * 4, "none, l4-nft, l4-ebpf, l7");
        let s = steps(&all, &EXPERIMENTS, 3);
        assert_eq!(s.len(), 3 * EXPERIMENTS.len() * 2);
        let first: Vec<(u32, ExperimentId, &str)> = s.iter().take(3).map(|x| (x.rep, x.experiment, x.scenario.name)).collect();
        assert_eq!(first, [(1, ExperimentId::T1, "none"), (1, ExperimentId::T1, "l4-nft"), (1, ExperimentId::T2, "none")]);
        assert!(s.iter().enumerate().all(|(i, x)| x.index == i + 1));
        let holds: Vec<(u32, &str)> = s.iter().skip(30).map(|x| (x.rep, x.scenario.name)).collect();
        assert!(s.iter().skip(30).all(|x| x.experiment == ExperimentId::R1), "R1 comes last");
        assert_eq!(holds, [(1, "none"), (2, "none"), (3, "none"), (1, "l4-nft"), (2, "l4-nft"), (3, "l4-nft")]);
        assert_eq!(s[29].experiment, ExperimentId::C1);
        assert_eq!(s[29].rep, 3);
    }

    #[test]
    fn only_the_selected_experiments() {
        let all: Vec<&'static Scenario> = SCENARIOS.iter().take(2).collect();
        let s = steps(&all, &[ExperimentId::L1], 2);
        let got: Vec<(u32, ExperimentId, &str)> = s.iter().map(|x| (x.rep, x.experiment, x.scenario.name)).collect();
        assert_eq!(
            got,
            [
                (1, ExperimentId::L1, "none"),
                (1, ExperimentId::L1, "l4-nft"),
                (2, ExperimentId::L1, "none"),
                (2, ExperimentId::L1, "l4-nft")
            ]
        );
        let r1 = steps(&all, &[ExperimentId::R1], 1);
        assert_eq!(r1.len(), 2);
        assert!(r1.iter().all(|x| x.experiment == ExperimentId::R1));
    }

    #[test]
    fn progress_line() {
        let all: Vec<&'static Scenario> = SCENARIOS.iter().take(2).collect();
        let s = steps(&all, &EXPERIMENTS, 3);
        assert_eq!(progress_prefix(&s[7], s.len(), 3, 6), "[ 8/36] l4-nft Q1 rep 1/3 ... ");
        assert_eq!(progress_prefix(&s[0], s.len(), 3, 6), "[ 1/36] none   T1 rep 1/3 ... ");
    }
}
