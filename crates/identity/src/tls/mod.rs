//! rustls configurations for HBONE (docs/protocols.md section 2): TLS 1.3 only,
//! AES-GCM suites only, ALPN `h2`, no SNI, no resumption, mutual
//! authentication by SPIFFE identity rather than by host name.

mod client;
mod errors;
mod peer;
mod server;

/// The crypto provider HBONE uses (defined in `crate::crypto`, beside the
/// certificates that need it too).
pub use crate::crypto::provider;
pub use client::client_config;
pub use errors::{identity_mismatch, IdentityMismatch, TlsError, UntrustedPeer};
pub use peer::peer_identity;
pub use server::ServerTls;

/// The only ALPN protocol spoken on an HBONE port.
pub const ALPN_H2: &[u8] = b"h2";

/// The only TLS version offered or accepted.
pub static PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
