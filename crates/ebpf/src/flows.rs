#![allow(unsafe_code)]
//! The reader of the flow events the programs put in the ring buffer
//! (`ss_events_v1`). One reader per kernel: in a Kubernetes node the
//! node's agent, in the local cluster the agent (all nodes share one
//! kernel there). Events nobody reads are dropped by the kernel when the
//! buffer is full; the drop counters count regardless.

use crate::abi::{self, Event};
use aya::maps::{Map, MapData, RingBuf};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

pub struct FlowReader {
    ring: RingBuf<MapData>,
}

impl std::fmt::Debug for FlowReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowReader").finish_non_exhaustive()
    }
}

impl FlowReader {
    /// Opens the ring buffer pinned under `dir/maps`.
    pub fn open(dir: &Path) -> Result<Self, crate::node::Error> {
        let path = dir.join("maps").join(abi::maps::EVENTS);
        let data = MapData::from_pin(&path).map_err(|error| crate::node::Error::Open { path: path.display().to_string(), error })?;
        let ring = RingBuf::try_from(Map::RingBuf(data)).map_err(|error| crate::node::Error::Map { map: abi::maps::EVENTS, error })?;
        Ok(FlowReader { ring })
    }

    /// Waits up to `timeout` for events and returns those there are.
    pub fn read(&mut self, timeout: Duration) -> Vec<Event> {
        let mut out = self.drain();
        if out.is_empty() {
            let mut pfd = libc::pollfd { fd: self.ring.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: pfd is one valid pollfd, and the count says one.
            let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
            out = self.drain();
        }
        out
    }

    fn drain(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            if let Some(e) = Event::parse(&item) {
                out.push(e);
            }
        }
        out
    }
}
