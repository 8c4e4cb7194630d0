//! `cilium.io/v2` CiliumNetworkPolicy: the fields Slipstream enforces, and
//! the ones it knows and refuses (L7 rules, FQDNs, ...), so a policy is
//! never taken with part of it silently ignored. Any other field is an
//! unknown-field error naming it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// A field Slipstream knows and does not enforce: its presence is refused.
pub type Refused = Option<serde_json::Value>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumNetworkPolicy {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Required unless `specs` is used (which is refused).
    #[serde(default)]
    pub spec: Option<CnpSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub specs: Refused,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CnpSpec {
    #[serde(default)]
    pub endpoint_selector: Option<LabelSelector>,
    #[serde(default)]
    pub ingress: Option<Vec<CnpRule>>,
    #[serde(default)]
    pub egress: Option<Vec<CnpRule>>,
    #[serde(default)]
    pub ingress_deny: Option<Vec<CnpRule>>,
    #[serde(default)]
    pub egress_deny: Option<Vec<CnpRule>>,
    #[serde(default)]
    pub enable_default_deny: Option<DefaultDeny>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub labels: Option<serde_json::Value>,
    #[serde(default)]
    pub node_selector: Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultDeny {
    #[serde(default)]
    pub ingress: Option<bool>,
    #[serde(default)]
    pub egress: Option<bool>,
}

/// An ingress or egress rule (both shapes in one type; the translation
/// refuses the fields of the wrong direction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CnpRule {
    #[serde(default)]
    pub from_endpoints: Option<Vec<LabelSelector>>,
    #[serde(default)]
    pub to_endpoints: Option<Vec<LabelSelector>>,
    #[serde(default, rename = "fromCIDR")]
    pub from_cidr: Option<Vec<String>>,
    #[serde(default, rename = "toCIDR")]
    pub to_cidr: Option<Vec<String>>,
    #[serde(default, rename = "fromCIDRSet")]
    pub from_cidr_set: Option<Vec<CidrRule>>,
    #[serde(default, rename = "toCIDRSet")]
    pub to_cidr_set: Option<Vec<CidrRule>>,
    #[serde(default)]
    pub from_entities: Option<Vec<String>>,
    #[serde(default)]
    pub to_entities: Option<Vec<String>>,
    #[serde(default)]
    pub to_ports: Option<Vec<PortRule>>,
    // Known, not supported: refused by name.
    #[serde(default)]
    pub from_requires: Refused,
    #[serde(default)]
    pub to_requires: Refused,
    #[serde(default, rename = "toFQDNs")]
    pub to_fqdns: Refused,
    #[serde(default)]
    pub to_services: Refused,
    #[serde(default)]
    pub to_groups: Refused,
    #[serde(default)]
    pub from_groups: Refused,
    #[serde(default)]
    pub from_nodes: Refused,
    #[serde(default)]
    pub to_nodes: Refused,
    #[serde(default)]
    pub icmps: Refused,
    #[serde(default)]
    pub authentication: Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CidrRule {
    #[serde(default)]
    pub cidr: Option<String>,
    #[serde(default)]
    pub except: Option<Vec<String>>,
    #[serde(default)]
    pub cidr_group_ref: Refused,
    #[serde(default)]
    pub cidr_group_selector: Refused,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortRule {
    #[serde(default)]
    pub ports: Option<Vec<PortProtocol>>,
    // L7 and TLS: refused.
    #[serde(default)]
    pub rules: Refused,
    #[serde(default)]
    pub server_names: Refused,
    #[serde(default, rename = "terminatingTLS")]
    pub terminating_tls: Refused,
    #[serde(default, rename = "originatingTLS")]
    pub originating_tls: Refused,
    #[serde(default)]
    pub listener: Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortProtocol {
    /// A number or a named port, as a string (`"80"`, `"http"`).
    #[serde(default, deserialize_with = "string_or_number")]
    pub port: Option<String>,
    #[serde(default)]
    pub end_port: Option<i32>,
    #[serde(default)]
    pub protocol: Option<String>,
}

fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        S(String),
        N(i64),
    }
    Ok(Option::<V>::deserialize(d)?.map(|v| match v {
        V::S(s) => s,
        V::N(n) => n.to_string(),
    }))
}
