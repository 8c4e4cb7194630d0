//! The mesh's lock policy: a poisoned lock is recovered, never a reason to
//! panic again.
//!
//! A `std::sync::Mutex` is poisoned when a thread panicked while holding
//! it. Every lock in this workspace guards counters, maps and caches whose
//! updates are a few field writes that leave them consistent at every
//! step, and the long-running processes (the node proxy serving every pod
//! of its node, the waypoint, the control plane) run each connection in
//! its own task: one connection's panic must not turn every later lock
//! into a panic that takes the whole process, and every pod's traffic,
//! down with it. So the guard is taken back ([`LockExt::locked`]), and
//! `Mutex::lock` itself is refused by clippy (`clippy.toml`) so that no
//! `unwrap()` or `expect()` on a lock comes back.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] under the policy above.
pub trait LockExt<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    #[allow(clippy::disallowed_methods)] // The one place that calls it.
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] under the same policy.
pub trait RwLockExt<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    #[allow(clippy::disallowed_methods)] // The one place that calls it.
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[allow(clippy::disallowed_methods)] // The one place that calls it.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_back_with_its_value() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.locked();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), 2);
    }
}
