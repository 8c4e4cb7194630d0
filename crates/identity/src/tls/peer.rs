//! Reading the verified peer identity after a handshake.

use rustls::CommonState;

use super::errors::TlsError;
use crate::spiffe::SpiffeId;
use crate::x509;

/// The peer's identity: the first SPIFFE URI SAN of its leaf certificate.
///
/// Only meaningful after a handshake with one of this crate's configurations,
/// which verified the chain and the SAN.
pub fn peer_identity(state: &CommonState) -> Result<SpiffeId, TlsError> {
    let leaf = state.peer_certificates().and_then(|certs| certs.first()).ok_or(TlsError::NoPeerCertificate)?;
    x509::spiffe_ids(leaf)?.into_iter().next().ok_or(TlsError::NoSpiffeId)
}
