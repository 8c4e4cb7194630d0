//! Socket options socket2 does not wrap.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// IP_BIND_ADDRESS_NO_PORT: `bind(ip, 0)` only records the address and the
/// port is chosen at `connect()`, by the whole 4-tuple. Without it, every
/// transparent upstream socket (bound to the client pod's IP) makes the
/// kernel search for a port no other socket on that IP holds, TIME_WAIT
/// ones included: a linear scan under a lock that, after a few thousand
/// short connections, took most of a core and stalled the runtime thread
/// making the call.
pub fn set_bind_address_no_port(s: &socket2::Socket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads size_of::<c_int>() bytes from `one`, which
    // lives across the call; the fd is open for as long as `s` is borrowed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Shuts a socket down in both directions by its descriptor, from outside
/// the task that owns it (policy revocation). The caller guarantees the
/// descriptor is still open and still that socket: `tracker` removes an
/// entry, under the same lock, before its socket is closed.
pub fn shutdown_fd(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: shutdown(2) on an fd the caller guarantees open; no memory is
    // touched. SO_LINGER 0 first, so the peer sees a reset, not a clean end.
    unsafe {
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
        if libc::shutdown(fd, libc::SHUT_RDWR) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
