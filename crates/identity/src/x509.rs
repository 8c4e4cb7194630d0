//! Reading the few X.509 fields the mesh cares about (URI SANs, validity,
//! serial) out of DER, in one place.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::CertError;
use crate::spiffe::{SpiffeId, SpiffeIdError, SPIFFE_PREFIX};

/// The parts of a leaf certificate that the mesh reads.
#[derive(Debug, Clone)]
pub(crate) struct LeafInfo {
    pub uri_sans: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// Lower-case hex, without separators (what `openssl x509 -serial` prints).
    pub serial: String,
}

pub(crate) fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, CertError> {
    let (rest, cert) = X509Certificate::from_der(der).map_err(|e| CertError::X509(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CertError::X509("trailing bytes after the certificate".into()));
    }
    Ok(cert)
}

pub(crate) fn leaf_info(der: &[u8]) -> Result<LeafInfo, CertError> {
    let cert = parse_cert(der)?;
    let validity = cert.validity();
    Ok(LeafInfo {
        uri_sans: uri_sans(&cert)?,
        not_before: to_system_time(validity.not_before.timestamp()),
        not_after: to_system_time(validity.not_after.timestamp()),
        serial: hex(cert.raw_serial()),
    })
}

/// notBefore and notAfter of any certificate.
pub(crate) fn validity(der: &[u8]) -> Result<(SystemTime, SystemTime), CertError> {
    let cert = parse_cert(der)?;
    let v = cert.validity();
    Ok((to_system_time(v.not_before.timestamp()), to_system_time(v.not_after.timestamp())))
}

/// notBefore and notAfter of a DER certificate (to check operator material
/// before using it).
pub fn certificate_validity(der: &[u8]) -> Result<(SystemTime, SystemTime), CertError> {
    validity(der)
}

/// A time as `2024-05-01 12:00:00 UTC`, for messages.
pub fn format_time(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(d) => {
            format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC", d.year(), u8::from(d.month()), d.day(), d.hour(), d.minute(), d.second())
        }
        Err(_) => format!("{secs} s after 1970"),
    }
}

pub(crate) fn uri_sans(cert: &X509Certificate<'_>) -> Result<Vec<String>, CertError> {
    let san = cert.subject_alternative_name().map_err(|e| CertError::X509(format!("subjectAltName: {e}")))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Why the SPIFFE identities of a peer certificate could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SanError {
    #[error("malformed certificate: {0}")]
    Malformed(String),
    #[error("malformed SPIFFE URI SAN: {0}")]
    BadSpiffeId(#[from] SpiffeIdError),
}

/// The SPIFFE URI SANs of a certificate, in certificate order.
///
/// Like ztunnel, a `spiffe://` SAN that is not a valid workload identity makes
/// the whole certificate unusable rather than being skipped: a CA that emits
/// one is misconfigured and silently ignoring it could change which SAN counts
/// as "the first".
pub(crate) fn spiffe_ids(der: &[u8]) -> Result<Vec<SpiffeId>, SanError> {
    let cert = parse_cert(der).map_err(|e| SanError::Malformed(e.to_string()))?;
    let uris = uri_sans(&cert).map_err(|e| SanError::Malformed(e.to_string()))?;
    uris.iter().filter(|uri| uri.starts_with(SPIFFE_PREFIX)).map(|uri| uri.parse::<SpiffeId>().map_err(SanError::from)).collect()
}

fn to_system_time(unix_secs: i64) -> SystemTime {
    if unix_secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix_secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(unix_secs.unsigned_abs())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
