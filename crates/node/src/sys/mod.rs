//! The only place with `unsafe`: entering a network namespace around the
//! creation of a socket, resource limits, socket options socket2 lacks, and
//! returning freed heap memory to the kernel.

pub mod mem;
pub mod netns;
pub mod rlimit;
pub mod sockopt;
