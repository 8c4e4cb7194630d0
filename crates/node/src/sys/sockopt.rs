//! Socket options neither socket2 nor rustix wrap (rustix 1.1 has no
//! IP_BIND_ADDRESS_NO_PORT).
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
