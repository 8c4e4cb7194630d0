//! `NAMESPACE/NAME`: how the flags that name one object of the API server
//! (`--ca-secret`, `--leader-elect`) take it.

use slipstream_k8s::names::{check_dns_label, check_dns_subdomain};

/// One namespaced object's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    pub fn new(namespace: &str, name: &str) -> NamespacedName {
        NamespacedName { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for NamespacedName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((namespace, name)) = s.split_once('/') else {
            return Err(format!("{s:?}: expected NAMESPACE/NAME"));
        };
        check_dns_label(namespace).map_err(|e| format!("{s:?}: the namespace {e}"))?;
        check_dns_subdomain(name).map_err(|e| format!("{s:?}: the name {e}"))?;
        Ok(NamespacedName::new(namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_slash_name() {
        assert_eq!("slipstream-system/slipstream-ca".parse(), Ok(NamespacedName::new("slipstream-system", "slipstream-ca")));
        assert_eq!(NamespacedName::new("a", "b.c").to_string(), "a/b.c");
        for bad in ["", "ca", "/ca", "ns/", "ns/a/b", "Ns/ca", "ns/Ca"] {
            assert!(bad.parse::<NamespacedName>().is_err(), "{bad:?}");
        }
    }
}
