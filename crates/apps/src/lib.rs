//! Built-in sample applications that run inside pods of the local cluster, so
//! that a demo needs nothing from the network:
//!
//! - [`echo`]: an HTTP/1.1 + HTTP/2 (prior knowledge) echo server compatible
//!   with what fortio's load client expects from `fortio server`, plus a raw
//!   TCP echo port. `/headers` reports the TCP peer address as the server saw
//!   it, which is how tests prove the mesh preserves the client's source IP.
//! - [`bookinfo`]: the four services of Istio's bookinfo sample with the same
//!   call graph (productpage -> details, productpage -> reviews v1/v2/v3 ->
//!   ratings), each answer naming the role and version that served it.
//!
//! The CLI embeds [`EchoArgs`] and [`BookinfoArgs`] as `slipstream app echo` and
//! `slipstream app bookinfo` and calls [`run_echo`] / [`run_bookinfo`], which
//! own their runtime and exit cleanly on SIGTERM/SIGINT. Tests use the async
//! building blocks ([`serve_echo_http`], [`serve_echo_tcp`],
//! [`serve_bookinfo`], [`bind_listener`]) on loopback ephemeral ports.
#![forbid(unsafe_code)]

pub mod bookinfo;
pub mod echo;
pub mod http;
pub mod net;
mod runtime;

pub use bookinfo::{run_bookinfo, serve_bookinfo, BookinfoArgs, BookinfoConfig, Role, Upstreams};
pub use echo::{run_echo, serve_banner_tcp, serve_echo_http, serve_echo_tcp, EchoArgs, EchoConfig};
pub use http::AccessLog;
pub use net::bind_listener;
