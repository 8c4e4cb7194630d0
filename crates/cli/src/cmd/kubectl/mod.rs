//! kubectl's verbs on the local cluster, with kubectl's flags, words and
//! exit codes (issue 17): `get`, `describe`, `label`, `annotate`,
//! `create namespace`, `wait`, and `delete KIND NAME`. What they read is
//! the agent's API-server view of its objects (`Request::Objects`: the
//! objects as Kubernetes would serve them, with `apiVersion` and `kind`);
//! what they change goes through the agent's checks like an `apply`.
//! Parsing and formatting are pure and table-tested.
//!
//! One module per verb (`get`, `describe`, `label`, `create`, `delete`,
//! `wait`), over the kinds they know (`kinds`) and what they were asked
//! for (`select`).

mod args;
mod create;
mod delete;
mod describe;
mod get;
mod kinds;
mod label;
mod select;
mod wait;

pub use args::{CreateCommand, LabelArgs, ScopeArgs};

pub use create::create_namespace;
pub use delete::delete;
pub use describe::describe;
pub use get::{get, table, GetArgs};
pub use label::label;
pub(crate) use select::objects;
pub use select::{Scope, Selector};
pub use wait::{wait, WaitArgs};
