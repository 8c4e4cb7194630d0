// The schema of policy-cases.yaml, shared by the two tests that run it
// (crates/control/tests/policy_cases.rs through the engine,
// crates/cli/tests/policy_traffic.rs as traffic), included by `#[path]`.

use serde::Deserialize;

#[derive(Deserialize)]
pub struct Cases {
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub id: String,
    /// What the case shows.
    pub title: String,
    /// Where its expected answers come from.
    pub source: String,
    /// The policies (YAML documents) added to the world.
    pub objects: String,
    pub checks: Vec<Check>,
}

#[derive(Deserialize)]
pub struct Check {
    /// `NS/POD`.
    pub from: String,
    /// `NS/POD:PORT`.
    pub to: String,
    /// `allow` or `deny`.
    pub expect: String,
    /// `Kind ns/name` of the policy that decides.
    #[serde(default)]
    pub by: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
}

pub const WORLD: &str = include_str!("policy-world.yaml");
pub const CASES: &str = include_str!("policy-cases.yaml");

pub fn load() -> Cases {
    serde_yaml::from_str(CASES).expect("policy-cases.yaml parses")
}
