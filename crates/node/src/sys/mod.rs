//! System calls: entering a network namespace around the creation of a
//! socket (safe, through rustix), the cgroup's memory limit, and the only
//! `unsafe` of the crate: one socket option neither socket2 nor rustix
//! wraps. (The open-file limit and the allocator's tuning are the shared
//! `slipstream_proxy::sys`.)

pub mod cgroup;
pub mod netns;
pub mod sockopt;
