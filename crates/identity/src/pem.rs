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

/// `der` as PEM text (RFC 7468): base64 in 64-column lines, LF line ends.
pub(crate) fn encode(label: &str, der: &[u8]) -> String {
    ::pem::encode_config(&::pem::Pem::new(label, der), ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF))
}

pub(crate) fn encode_certs<'a>(certs: impl IntoIterator<Item = &'a CertificateDer<'a>>) -> String {
    certs.into_iter().map(|c| encode("CERTIFICATE", c.as_ref())).collect()
}

pub(crate) fn read_file(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_rfc_7468_text() {
        // Base64 in 64-column lines, LF line ends, padding kept; an empty
        // body has no line at all.
        let hundred: Vec<u8> = (0..100).collect();
        let cases: [(&str, &[u8], &str); 3] = [
            ("TEST", b"", "-----BEGIN TEST-----\n-----END TEST-----\n"),
            ("PRIVATE KEY", b"hello world!?", "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQhPw==\n-----END PRIVATE KEY-----\n"),
            (
                "CERTIFICATE",
                &hundred,
                "-----BEGIN CERTIFICATE-----\n\
                 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4v\n\
                 MDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5f\n\
                 YGFiYw==\n\
                 -----END CERTIFICATE-----\n",
            ),
        ];
        for (label, der, want) in cases {
            assert_eq!(encode(label, der), want, "{label}");
        }
    }

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
