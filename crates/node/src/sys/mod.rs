//! The only place with `unsafe`: entering a network namespace around the
//! creation of a socket, resource limits, and socket options socket2 lacks.

pub mod netns;
pub mod rlimit;
pub mod sockopt;
