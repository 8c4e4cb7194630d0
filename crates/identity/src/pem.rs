//! PEM decoding and encoding of certificates and keys.

use std::path::Path;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::CertError;

/// Every `CERTIFICATE` block of `pem`, in order; at least one.
pub(crate) fn certs(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs =
        rustls_pemfile::certs(&mut pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(|e| CertError::Pem(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(CertError::PemMissing { what, label: "CERTIFICATE" });
    }
    Ok(certs)
}

/// The first private key of `pem` (PKCS#8, SEC1 or PKCS#1).
pub(crate) fn private_key(pem: &str, what: &'static str) -> Result<PrivateKeyDer<'static>, CertError> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(|e| CertError::Pem(format!("{what}: {e}")))?
        .ok_or(CertError::PemMissing { what, label: "PRIVATE KEY" })
}

pub(crate) fn encode(label: &str, der: &[u8]) -> String {
    // PEM is base64 in 64-column lines (RFC 7468).
    let b64 = base64(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

pub(crate) fn encode_certs<'a>(certs: impl IntoIterator<Item = &'a CertificateDer<'a>>) -> String {
    certs.into_iter().map(|c| encode("CERTIFICATE", c.as_ref())).collect()
}

pub(crate) fn read_file(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io { path: path.to_owned(), source })
}

fn base64(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(TABLE[(n >> 18) as usize & 63] as char);
        out.push(TABLE[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 { TABLE[(n >> 6) as usize & 63] as char } else { '=' });
        out.push(if chunk.len() > 2 { TABLE[n as usize & 63] as char } else { '=' });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trip() {
        for len in 0..200 {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let pem = encode("CERTIFICATE", &data);
            let back = rustls_pemfile::certs(&mut pem.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
            if len == 0 {
                // an empty body still decodes as one (empty) item
                assert!(back.len() <= 1);
            } else {
                assert_eq!(back[0].as_ref(), &data[..]);
            }
        }
    }
}
