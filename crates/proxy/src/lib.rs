//! slipstream-proxy: what the mesh's two proxies share, so that the node
//! proxy (`slipstream-node`) and the waypoint (`slipstream-waypoint`) stand
//! side by side on it rather than one on the other (linkerd2-proxy's
//! `app/core` is the model).
//!
//! - [`limits`]: what one source may hold (per-source slots, the
//!   descriptor and buffer budgets, refusal logs, hold-offs), and
//!   [`config`]: the bounds and their flags ([`config::Limits`],
//!   [`config::LimitArgs`]), with the size and duration flag parsers.
//! - [`authz`]: the authorization seam over the policy engine (a
//!   connection's ingress and egress decisions, decided again on change),
//!   whose refusals are a [`denial::Denial`].
//! - [`control`]: the TLS channel to the control plane; over it [`xds`]
//!   (the delta xDS client) and [`caclient`] (workload certificates), and
//!   [`certs`] (where certificates come from, what is trusted).
//! - [`metrics`]: the label value types of Istio's metrics.
//! - [`process`]: a proxy process's set-up (logging with its per-call-site
//!   rate limit, non-dumpable), and [`sys`]: resource limits and the
//!   allocator's tuning.
//!
//! What must NOT go here: anything eBPF (the datapath belongs to the node
//! proxy: the waypoint does not link it) and anything of the local
//! cluster (`slipstream-testbed` is a test bed, never part of a production
//! process). A module that only one proxy uses stays in that proxy's
//! crate. `crates/cli/tests/structure.rs` checks the dependency rules.
//!
//! `unsafe` is allowed only in `sys` (glibc's malloc tuning and trimming,
//! `sys::mem`).
#![deny(unsafe_code)]

pub mod authz;
pub mod caclient;
pub mod certs;
pub mod config;
pub mod control;
pub mod denial;
pub mod limits;
pub mod metrics;
pub mod process;
pub mod sys;
pub mod xds;
