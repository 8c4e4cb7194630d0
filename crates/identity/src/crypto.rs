//! The one crypto provider of every TLS connection and certificate check
//! in the mesh: aws-lc-rs with the two suites HBONE peers expect
//! (docs/protocols.md section 2). Its own module so that certificates
//! (`cert`, `ca`) and TLS configurations (`tls`) both use it without
//! depending on each other.

use std::sync::{Arc, OnceLock};

use rustls::crypto::{aws_lc_rs, CryptoProvider};

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
