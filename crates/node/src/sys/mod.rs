//! System calls: entering a network namespace around the creation of a
//! socket and the open-file limit (safe, through rustix), and the only
//! `unsafe` of the crate: one socket option neither socket2 nor rustix
//! wraps, and glibc's allocator tuning and trimming (`mem`).

pub mod cgroup;
pub mod mem;
pub mod netns;
pub mod rlimit;
pub mod sockopt;
