//! A node of the local cluster, as the agent knows it: what pods,
//! capture and node proxies on it are placed by.

use std::net::Ipv4Addr;

pub struct Node {
    pub name: String,
    pub index: usize,
    /// The node's network namespace.
    pub netns: String,
    pub ip: Ipv4Addr,
}
