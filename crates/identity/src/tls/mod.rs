//! rustls configurations for HBONE (PROTOCOLS.md section 2): TLS 1.3 only,
//! AES-GCM suites only, ALPN `h2`, no SNI, no resumption, mutual
//! authentication by SPIFFE identity rather than by host name.

mod client;
mod errors;
mod peer;
mod server;

use std::sync::{Arc, OnceLock};

use rustls::crypto::{aws_lc_rs, CryptoProvider};

pub use client::client_config;
pub use errors::{identity_mismatch, IdentityMismatch, TlsError, UntrustedPeer};
pub use peer::peer_identity;
pub use server::ServerTls;

/// The only ALPN protocol spoken on an HBONE port.
pub const ALPN_H2: &[u8] = b"h2";

/// The only TLS version offered or accepted.
pub static PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The aws-lc-rs provider restricted to the two suites HBONE peers expect
/// (no ChaCha20: peers are expected to have AES hardware, and ztunnel
/// offers exactly these two).
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut provider = aws_lc_rs::default_provider();
            provider.cipher_suites =
                vec![aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384, aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
            Arc::new(provider)
        })
        .clone()
}
