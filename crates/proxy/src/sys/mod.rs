//! System calls of a proxy process: the open-file limit and a directory's
//! changes (safe, through rustix), and the only `unsafe` of the crate: glibc's allocator tuning
//! and trimming (`mem`).

pub mod dirwatch;
pub mod mem;
pub mod rlimit;
