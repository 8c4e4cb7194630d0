//! Kubernetes name rules and the names the local cluster generates.

/// RFC 1123 label: lower-case alphanumerics and '-', starts and ends
/// alphanumeric, at most 63 characters (namespaces, services, ports names).
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!("{} is longer than 63 characters", shown(s)));
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if !s.chars().all(ok_char) {
        return Err(format!("{} must consist of lower-case letters, digits and '-'", shown(s)));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(format!("{} must start and end with a letter or digit", shown(s)));
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters (pods,
/// deployments, service accounts). We additionally cap at 63 so that pod
/// names fit interface and host names; Kubernetes' own generated names do.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!("{} is longer than 253 characters", shown(s)));
    }
    for part in s.split('.') {
        check_dns_label(part).map_err(|_| {
            format!(
                "{} must consist of lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit",
                shown(s)
            )
        })?;
    }
    Ok(())
}

/// Label keys: optional DNS-subdomain prefix and '/', then a name of at most
/// 63 characters of alphanumerics, '-', '_' and '.'.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|e| format!("label key prefix: {e}"))?;
    }
    check_label_value(name).map_err(|e| format!("label key {}: {e}", shown(k)))?;
    if name.is_empty() {
        return Err(format!("label key {} has an empty name", shown(k)));
    }
    Ok(())
}

pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("{} is longer than 63 characters", shown(v)));
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    if !v.chars().all(ok) {
        return Err(format!("{} may hold only letters, digits, '-', '_' and '.'", shown(v)));
    }
    if let (Some(f), Some(l)) = (v.chars().next(), v.chars().last()) {
        if !f.is_ascii_alphanumeric() || !l.is_ascii_alphanumeric() {
            return Err(format!("{} must start and end with a letter or digit", shown(v)));
        }
    }
    Ok(())
}

/// How many characters of a value an error message shows.
pub const SHOWN_CHARS: usize = 80;

/// A value quoted for an error message, cut to `SHOWN_CHARS` characters
/// with its full size (`"aaaa..."... (1048576 bytes)`), so that a huge
/// value is never echoed whole.
pub fn shown(v: &str) -> String {
    if v.chars().count() <= SHOWN_CHARS {
        return format!("{v:?}");
    }
    let head: String = v.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}... ({} bytes)", v.len())
}

/// The alphabet Kubernetes uses for generated name suffixes (no vowels, no
/// look-alike characters), so generated names look familiar.
const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// FNV-1a: stable across runs and Rust versions (std's hasher is not).
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

pub fn safe_encode(mut v: u64, len: usize) -> String {
    let mut s = String::with_capacity(len);
    for _ in 0..len {
        s.push(SAFE[(v % SAFE.len() as u64) as usize] as char);
        v /= SAFE.len() as u64;
    }
    s
}

/// Name of replica `index` of a Deployment: `<deployment>-<template hash>-<suffix>`,
/// the shape Kubernetes gives (`echo-7d9c8f6b5d-x2x7q`) but deterministic,
/// so that re-applying the same Deployment keeps the same pods.
pub fn replica_pod_name(deployment: &str, template_hash: &str, index: usize) -> String {
    let suffix = safe_encode(fnv1a(format!("{deployment}/{template_hash}/{index}").as_bytes()), 5);
    format!("{deployment}-{template_hash}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(check_dns_label("echo-1").is_ok());
        assert!(check_dns_label("Echo").is_err());
        assert!(check_dns_label("-echo").is_err());
        assert!(check_dns_label("echo-").is_err());
        assert!(check_dns_label("").is_err());
        assert!(check_dns_label(&"a".repeat(64)).is_err());
        assert!(check_dns_subdomain("a.b-c").is_ok());
        assert!(check_dns_subdomain("a..b").is_err());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(check_label_key("istio.io/dataplane-mode").is_ok());
        assert!(check_label_key("app").is_ok());
        assert!(check_label_key("bad key").is_err());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("v1.2_3").is_ok());
        assert!(check_label_value("-x").is_err());
    }

    #[test]
    fn shown_values_are_cut() {
        assert_eq!(shown("web"), "\"web\"");
        let big = "x".repeat(1 << 20);
        let s = shown(&big);
        assert_eq!(s, format!("\"{}\"... (1048576 bytes)", "x".repeat(SHOWN_CHARS)));
        let e = check_label_value(&big).unwrap_err();
        assert!(e.len() < 200 && e.contains("(1048576 bytes)"), "{e}");
    }

    #[test]
    fn replica_names_are_stable_and_distinct() {
        let a = replica_pod_name("echo", "5b7c8d9f6g", 0);
        assert_eq!(a, replica_pod_name("echo", "5b7c8d9f6g", 0));
        assert_ne!(a, replica_pod_name("echo", "5b7c8d9f6g", 1));
        assert!(a.starts_with("echo-5b7c8d9f6g-"));
        assert_eq!(a.len(), "echo-5b7c8d9f6g-".len() + 5);
        check_dns_subdomain(&a).unwrap();
    }
}
