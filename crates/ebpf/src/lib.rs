//! The eBPF datapath (docs/datapath.md): BPF programs in C (`bpf/`, one
//! file per attach point, built by build.rs with clang and embedded), the
//! ABI they share with Rust ([`abi`]), the loader that attaches them to
//! pods ([`loader`], the CNI's part), the node proxy's view of the maps
//! ([`node`]) and the policy compiler that fills them from the engine
//! ([`policy`]).

pub mod abi;
pub mod flows;
pub mod kernel_policy;
pub mod loader;
pub mod node;
pub mod sys;

pub use flows::FlowReader;
pub use loader::{remove_all, Datapath, Hook, Options, PodAttach, ServiceLb};
pub use node::NodeMaps;
