//! Handing freed heap memory back to the kernel.
#![allow(unsafe_code)]

/// Releases the free memory of every malloc arena (glibc `malloc_trim`).
/// glibc keeps freed chunks in its per-thread arenas, so after a burst of
/// thousands of connections the proxy would stay at its peak resident size
/// though the connections are gone. Returns whether anything was released;
/// a no-op with other C libraries and under the binary's mimalloc (which
/// returns emptied pages by itself).
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists and
        // is safe to call at any time from any thread.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// With glibc malloc (the `slipstream` binary itself runs on mimalloc, where
/// this does nothing): keeps bulk-transfer buffers (up to one 1 MiB frame each) in the heap
/// instead of fresh mmaps, and lets up to 8 MiB of free heap stay mapped:
/// otherwise each new buffer of a fast stream costs 256 page faults and
/// zeroed pages. Memory freed by many closed connections is still returned,
/// by [`release_free_heap`].
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; called once at
        // start-up, before the runtime's threads exist.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
        }
    }
}
