//! The page's prose sections: the run's facts, the failed runs and
//! warnings, the scenarios, the experiments, and how to reproduce the run.

use super::fmt;
use crate::results::Results;
use std::fmt::Write;

/// When, what and where the run was: commit, repetitions, machine, tools.
pub(super) fn facts(s: &mut String, r: &Results) {
    let commit = match &r.commit {
        Some(c) => format!("commit `{}`{}", &c.hash[..c.hash.len().min(12)], if c.dirty { " with uncommitted changes" } else { "" }),
        None => "commit unknown".into(),
    };
    let m = &r.machine;
    let tools: Vec<String> = r.tools.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        s,
        "Run {} (UTC), slipstream {} ({commit}), {} repetition(s) per figure{}, {}.\n\n\
         Machine: {}, {} cores, {:.1} GiB, Linux {} ({}), open-file limit {}. Tools: {}.\n",
        r.started_at.replace('T', " ").trim_end_matches('Z'),
        r.version,
        r.settings.reps,
        if r.settings.quick { " (`--quick`: short durations, a smoke test, not a measurement)" } else { "" },
        if r.duration_s > 0.0 {
            format!("took {}", crate::timefmt::human(std::time::Duration::from_secs_f64(r.duration_s)))
        } else {
            "duration unknown".into()
        },
        m.cpu_model,
        m.cores,
        m.memory_gib,
        m.kernel,
        m.os,
        m.open_files_limit,
        if tools.is_empty() { "unknown".into() } else { tools.join(", ") },
    );
    if let Some(k) = &r.kubernetes {
        super::kube::facts(s, k);
    }
}

/// The repetitions that failed or warned, if any.
pub(super) fn failures(s: &mut String, r: &Results) {
    let failed: Vec<_> = r.runs.iter().filter(|x| !x.ok()).collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "## Failed runs\n\nThese repetitions produced no figures; the medians are over the others.\n");
        for f in failed {
            let _ = writeln!(s, "- {} {} rep {}: {}", f.scenario, f.experiment, f.rep, f.error.as_deref().unwrap_or(""));
        }
        s.push('\n');
    }
    let warned: Vec<_> = r.runs.iter().filter(|x| !x.warnings.is_empty()).collect();
    if !warned.is_empty() {
        let _ = writeln!(s, "## Warnings\n\nThese repetitions count, but did not go exactly as asked.\n");
        for w in warned {
            let _ = writeln!(s, "- {} {} rep {}: {}", w.scenario, w.experiment, w.rep, w.warnings.join("; "));
        }
        s.push('\n');
    }
}

/// What each scenario is, or why it was not measured.
pub(super) fn scenarios(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Scenarios\n");
    for x in &r.scenarios {
        match &x.not_available {
            None => {
                let _ = writeln!(s, "- `{}`: {} (namespace `{}`)", x.name, x.description, x.namespace.as_deref().unwrap_or("?"));
            }
            Some(why) => {
                let _ = writeln!(s, "- `{}`: {}: **{why}**", x.name, x.description);
            }
        }
    }
    if let Some(k) = &r.kubernetes {
        return super::kube::scenarios(s, k);
    }
    let _ = writeln!(
        s,
        "\nEach measured scenario is a namespace of one local cluster (`bench`, 2 nodes) holding the same two pods: a \
         client on node1 and a server on node2 (fortio's HTTP and TCP echo servers and an iperf3 server) behind the \
         Service `server`, which every experiment addresses by name.\n"
    );
}

/// What each experiment runs, and in which order the steps ran.
pub(super) fn experiments(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Experiments\n\n| id | what | run in the client pod |\n|---|---|---|");
    for e in &r.experiments {
        let _ = writeln!(s, "| {} | {} | `{}` |", e.id, e.title, fmt::cell(&e.command));
    }
    if r.kubernetes.is_some() {
        return super::kube::steps(s);
    }
    let _ = writeln!(
        s,
        "\nSteps run in the order repetition, experiment, scenario: the scenarios compared in one figure are measured \
         back to back, the repetitions of one experiment minutes apart. R1's held connections come last, scenario by \
         scenario, so that the memory a proxy keeps after them inflates no other figure; each R1 waits until the \
         proxies have closed their side before the next step, and the next R1 of the same scenario waits a further \
         TIME_WAIT (60 s) so that its connections cannot collide with the sockets of the last.\n"
    );
}

/// The commands that reproduce the run.
pub(super) fn reproduce(s: &mut String, r: &Results) {
    if r.kubernetes.is_some() {
        return super::kube::reproduce(s, r);
    }
    let _ = writeln!(
        s,
        "## Reproduce\n\nAs root, from a clone of the repository{}:\n\n```sh\nscripts/setup.sh\ncargo build --release -p slipstream-cli\n{}\n```\n\n\
         `results.json` holds every repetition, the machine and the tools; `--quick` is the smoke test CI runs.",
        r.commit.as_ref().map(|c| format!(" at commit `{}`", c.hash)).unwrap_or_default(),
        fmt::reproduce_command(&r.command),
    );
}
