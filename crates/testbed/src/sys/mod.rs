//! Everything that changes the machine. Each module has one concern.

pub mod capture;
pub mod cgroup;
pub mod cmd;
pub mod net;
pub mod netns;
pub mod podinit;
pub mod signals;
pub mod spawn;
