//! Running a closure inside a network namespace: on a fresh thread, because
//! setns(2) changes only the calling thread and we must not move the
//! caller's.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

pub fn in_netns<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<T> {
    let file = File::open(netns)?;
    std::thread::spawn(move || {
        move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))?;
        Ok(f())
    })
    .join()
    .map_err(|_| std::io::Error::other("thread running in a network namespace panicked"))?
}
