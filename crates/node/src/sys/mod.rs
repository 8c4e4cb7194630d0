//! The only place with `unsafe`: entering a network namespace around the
//! creation of a socket.

pub mod netns;
