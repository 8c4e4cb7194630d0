//! The arguments kubectl's verbs share (`label`/`annotate`, and where
//! `get`, `describe` and `wait` look), parsed by clap in `main`.

use super::{Scope, Selector};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum CreateCommand {
    /// `create namespace NAME` (alias `ns`).
    #[command(alias = "ns")]
    Namespace { name: String },
}

/// `label` and `annotate`: the same forms and flags.
#[derive(clap::Args)]
pub struct LabelArgs {
    /// KIND NAME KEY=VALUE... (or KIND/NAME); KEY- removes. Flags may come
    /// between them, as kubectl allows (`label svc x -n ns k=v`).
    #[arg(required = true, num_args = 1..)]
    pub args: Vec<String>,
    #[arg(short = 'n', long = "namespace")]
    pub namespace: Option<String>,
    #[arg(long)]
    pub overwrite: bool,
}

/// Where `get`, `describe` and `wait` look, with kubectl's flags.
#[derive(clap::Args)]
pub struct ScopeArgs {
    #[arg(short = 'n', long = "namespace")]
    pub namespace: Option<String>,
    #[arg(short = 'A', long = "all-namespaces")]
    pub all_namespaces: bool,
    /// Label selector: k=v, k!=v, k, !k, comma-separated.
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
}

impl ScopeArgs {
    pub fn scope(self) -> anyhow::Result<Scope> {
        let selector = Selector::parse(self.selector.as_deref().unwrap_or("")).map_err(anyhow::Error::msg)?;
        Ok(Scope { namespace: self.namespace, all: self.all_namespaces, selector })
    }
}
