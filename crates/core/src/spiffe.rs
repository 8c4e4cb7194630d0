//! SPIFFE workload identities: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! Pure, so it lives in core: the mesh model parses every workload's identity
//! and every service's SANs once, when the resource arrives. The identity
//! crate (certificates, TLS) re-exports these types from its own root.
//!
//! Istio (and so ztunnel) only ever issues and accepts this one shape of
//! SPIFFE ID, so the type models exactly that shape rather than an arbitrary
//! SPIFFE path. Validation happens once, here; everything downstream holds a
//! `SpiffeId` and never re-parses strings.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The URI scheme prefix of every SPIFFE ID.
pub const SPIFFE_PREFIX: &str = "spiffe://";

/// Kubernetes' and Istio's default trust domain.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Why a string is not a workload SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeIdError {
    #[error("{input:?} is not a SPIFFE ID: it must start with \"spiffe://\"")]
    MissingScheme { input: String },
    #[error(
        "{input:?} is not a workload SPIFFE ID: expected exactly five parts \
         <trust-domain>/ns/<namespace>/sa/<service-account>, found {parts}"
    )]
    WrongPartCount { input: String, parts: usize },
    #[error("{input:?} is not a workload SPIFFE ID: part {position} must be {expected:?}, found {found:?}")]
    WrongKeyword { input: String, position: usize, expected: &'static str, found: String },
    #[error("{input:?} is not a workload SPIFFE ID: the {what} is empty")]
    EmptyPart { input: String, what: &'static str },
    #[error("{input:?} is not a workload SPIFFE ID: the {what} contains the invalid character {ch:?}")]
    InvalidCharacter { input: String, what: &'static str, ch: char },
    #[error("{input:?} is not a workload SPIFFE ID: it is {len} bytes long, more than the 2048 SPIFFE allows")]
    TooLong { input: String, len: usize },
}

/// A trust domain such as `cluster.local`.
///
/// Kept distinct from a plain string so that a server's "own trust domain"
/// cannot be confused with, say, a namespace at a call site.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(Arc<str>);

impl TrustDomain {
    /// Validates and wraps a trust domain name.
    pub fn new(name: &str) -> Result<Self, SpiffeIdError> {
        check_segment(name, name, "trust domain")?;
        Ok(Self(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TrustDomain {
    fn default() -> Self {
        Self(Arc::from(DEFAULT_TRUST_DOMAIN))
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustDomain({})", self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = SpiffeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A workload identity. Cheap to clone: it is copied onto every connection.
///
/// Its URI is built once, when the identity is made, and the namespace and
/// service account are ranges of it: the waypoint writes both identities
/// of every request into its access log, metrics and policy checks, and
/// formatting them there each time was 3 % of its CPU. Equality and
/// hashing use the URI, which the three validated parts (none contains
/// `/`) determine exactly; ordering stays by parts.
#[derive(Clone)]
pub struct SpiffeId {
    trust_domain: TrustDomain,
    /// `spiffe://<td>/ns/<ns>/sa/<sa>`, at most [`MAX_URI_LEN`] bytes.
    uri: Arc<str>,
    /// Where the namespace starts and ends in `uri`.
    namespace: (u16, u16),
    /// Where the service account starts (it runs to the end).
    service_account: u16,
}

/// The longest SPIFFE ID the SPIFFE standard allows, in bytes.
pub const MAX_URI_LEN: usize = 2048;

impl PartialEq for SpiffeId {
    fn eq(&self, other: &Self) -> bool {
        self.uri == other.uri
    }
}

impl Eq for SpiffeId {}

impl std::hash::Hash for SpiffeId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.uri.hash(state)
    }
}

impl PartialOrd for SpiffeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SpiffeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.trust_domain, self.namespace(), self.service_account()).cmp(&(
            &other.trust_domain,
            other.namespace(),
            other.service_account(),
        ))
    }
}

impl SpiffeId {
    /// Builds an identity from its parts, validating each.
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Result<Self, SpiffeIdError> {
        let display = format!("{SPIFFE_PREFIX}{trust_domain}/ns/{namespace}/sa/{service_account}");
        check_segment(trust_domain, &display, "trust domain")?;
        check_segment(namespace, &display, "namespace")?;
        check_segment(service_account, &display, "service account")?;
        Self::from_checked(trust_domain, namespace, service_account, &display)
    }

    /// The parts already validated (`input` for the error).
    fn from_checked(trust_domain: &str, namespace: &str, service_account: &str, input: &str) -> Result<Self, SpiffeIdError> {
        let uri = format!("{SPIFFE_PREFIX}{trust_domain}/ns/{namespace}/sa/{service_account}");
        if uri.len() > MAX_URI_LEN {
            return Err(SpiffeIdError::TooLong { input: input.to_owned(), len: uri.len() });
        }
        let ns_start = SPIFFE_PREFIX.len() + trust_domain.len() + "/ns/".len();
        let ns_end = ns_start + namespace.len();
        let sa_start = ns_end + "/sa/".len();
        // All below MAX_URI_LEN, so they fit.
        Ok(Self {
            trust_domain: TrustDomain(Arc::from(trust_domain)),
            uri: Arc::from(uri),
            namespace: (ns_start as u16, ns_end as u16),
            service_account: sa_start as u16,
        })
    }

    /// Parses the policy form used by AuthorizationPolicy principals:
    /// `cluster.local/ns/default/sa/sleep` (no `spiffe://`).
    pub fn from_principal(principal: &str) -> Result<Self, SpiffeIdError> {
        parse_path(principal, principal)
    }

    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.uri[usize::from(self.namespace.0)..usize::from(self.namespace.1)]
    }

    pub fn service_account(&self) -> &str {
        &self.uri[usize::from(self.service_account)..]
    }

    /// The identity as policies compare it: without the `spiffe://` prefix.
    pub fn principal(&self) -> &str {
        &self.uri[SPIFFE_PREFIX.len()..]
    }

    /// The whole URI, `spiffe://<td>/ns/<ns>/sa/<sa>` (what `Display` writes).
    pub fn as_str(&self) -> &str {
        &self.uri
    }

    /// [`Self::as_str`], shared without copying.
    pub fn uri(&self) -> &Arc<str> {
        &self.uri
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpiffeId({self})")
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let Some(path) = input.strip_prefix(SPIFFE_PREFIX) else {
            return Err(SpiffeIdError::MissingScheme { input: input.to_owned() });
        };
        parse_path(path, input)
    }
}

impl TryFrom<&str> for SpiffeId {
    type Error = SpiffeIdError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Parses `<td>/ns/<ns>/sa/<sa>`; `input` is only used in error messages.
fn parse_path(path: &str, input: &str) -> Result<SpiffeId, SpiffeIdError> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() != 5 {
        return Err(SpiffeIdError::WrongPartCount { input: input.to_owned(), parts: parts.len() });
    }
    for (position, expected) in [(1, "ns"), (3, "sa")] {
        if parts[position] != expected {
            return Err(SpiffeIdError::WrongKeyword {
                input: input.to_owned(),
                position: position + 1,
                expected,
                found: parts[position].to_owned(),
            });
        }
    }
    check_segment(parts[0], input, "trust domain")?;
    check_segment(parts[2], input, "namespace")?;
    check_segment(parts[4], input, "service account")?;
    SpiffeId::from_checked(parts[0], parts[2], parts[4], input)
}

/// ztunnel itself only checks the five-part structure. We additionally refuse
/// empty parts and characters that cannot appear in a URI SAN (IA5String) or
/// that would change the meaning of the URI (`/`, `?`, `#`, whitespace):
/// Kubernetes names never contain them, and a certificate carrying one would
/// not compare equal to the identity a policy names.
fn check_segment(segment: &str, input: &str, what: &'static str) -> Result<(), SpiffeIdError> {
    if segment.is_empty() {
        return Err(SpiffeIdError::EmptyPart { input: input.to_owned(), what });
    }
    if let Some(ch) = segment.chars().find(|c| !c.is_ascii_graphic() || matches!(c, '/' | '?' | '#')) {
        return Err(SpiffeIdError::InvalidCharacter { input: input.to_owned(), what, ch });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "spiffe://cluster.local/ns/default/sa/sleep";
        let id: SpiffeId = s.parse().unwrap();
        assert_eq!(id.trust_domain().as_str(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "sleep");
        assert_eq!(id.to_string(), s);
        assert_eq!(id.principal(), "cluster.local/ns/default/sa/sleep");
        assert_eq!(SpiffeId::from_principal(id.principal()).unwrap(), id);
        assert_eq!(SpiffeId::new("cluster.local", "default", "sleep").unwrap(), id);
    }

    #[test]
    fn rejections() {
        let cases = [
            ("cluster.local/ns/default/sa/sleep", "must start with"),
            ("http://cluster.local/ns/default/sa/sleep", "must start with"),
            ("spiffe://cluster.local/ns/default/sa", "found 4"),
            ("spiffe://cluster.local/ns/default/sa/sleep/extra", "found 6"),
            ("spiffe://cluster.local/ns/default/sa/sleep/", "found 6"),
            ("spiffe://cluster.local", "found 1"),
            ("spiffe://cluster.local/namespace/default/sa/sleep", "part 2 must be \"ns\""),
            ("spiffe://cluster.local/ns/default/serviceaccount/sleep", "part 4 must be \"sa\""),
            ("spiffe:///ns/default/sa/sleep", "trust domain is empty"),
            ("spiffe://cluster.local/ns//sa/sleep", "namespace is empty"),
            ("spiffe://cluster.local/ns/default/sa/", "service account is empty"),
            ("spiffe://cluster.local/ns/def ault/sa/x", "invalid character ' '"),
            ("spiffe://cluster.local/ns/default/sa/x?y", "invalid character '?'"),
            ("spiffe://cluster.local/ns/default/sa/é", "invalid character"),
        ];
        for (input, want) in cases {
            let err = input.parse::<SpiffeId>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err} lacks {want}");
        }
        assert!(SpiffeId::new("td", "a/b", "sa").is_err());
        assert!(TrustDomain::new("").is_err());
        let long = "n".repeat(MAX_URI_LEN);
        let err = SpiffeId::new("td", &long, "sa").unwrap_err().to_string();
        assert!(err.contains("more than the 2048 SPIFFE allows"), "{err}");
        let just = "n".repeat(MAX_URI_LEN - "spiffe://td/ns//sa/s".len());
        assert_eq!(SpiffeId::new("td", &just, "s").unwrap().as_str().len(), MAX_URI_LEN);
    }

    /// The parts are ranges of the one URI; comparison is by parts.
    #[test]
    fn parts_equality_and_order() {
        let id = |td: &str, ns: &str, sa: &str| SpiffeId::new(td, ns, sa).unwrap();
        for (td, ns, sa) in [("a", "b", "c"), ("example.org", "kube-system", "default"), ("t", "n-1", "s.a")] {
            let x = id(td, ns, sa);
            assert_eq!((x.trust_domain().as_str(), x.namespace(), x.service_account()), (td, ns, sa));
            assert_eq!(x.to_string(), format!("spiffe://{td}/ns/{ns}/sa/{sa}"));
            assert_eq!(x.principal(), format!("{td}/ns/{ns}/sa/{sa}"));
            assert_eq!(x.to_string().parse::<SpiffeId>().unwrap(), x);
        }
        assert_ne!(id("a", "b", "c"), id("a", "b", "d"));
        assert_ne!(id("a", "bc", "d"), id("a", "b", "cd"));
        // By parts, as before: "a-b" sorts after "a" although '-' < '/'.
        let mut v = [id("a-b", "x", "y"), id("a", "z", "z"), id("a", "b", "c")];
        v.sort();
        assert_eq!(v.iter().map(|x| x.principal()).collect::<Vec<_>>(), ["a/ns/b/sa/c", "a/ns/z/sa/z", "a-b/ns/x/sa/y"]);
        let set: std::collections::HashSet<SpiffeId> = [id("a", "b", "c"), id("a", "b", "c")].into_iter().collect();
        assert_eq!(set.len(), 1);
    }
}
