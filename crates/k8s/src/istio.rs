//! Istio kinds the mesh enforces, typed from a kept object's spec so that
//! a bad field is rejected at apply time with its path.

use crate::error::FieldError;
use crate::objects::{KeptObject, LabelSelector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MtlsMode {
    #[serde(rename = "UNSET")]
    Unset,
    #[serde(rename = "DISABLE")]
    Disable,
    #[serde(rename = "PERMISSIVE")]
    Permissive,
    #[serde(rename = "STRICT")]
    Strict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Mtls {
    #[serde(default)]
    pub mode: Option<MtlsMode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<LabelSelector>,
    #[serde(default)]
    pub mtls: Option<Mtls>,
    /// Keyed by port number (YAML keys may be numbers or strings).
    #[serde(default)]
    pub port_level_mtls: BTreeMap<String, Mtls>,
}

impl PeerAuthenticationSpec {
    pub fn mode(&self) -> MtlsMode {
        self.mtls.as_ref().and_then(|m| m.mode).unwrap_or(MtlsMode::Unset)
    }

    /// Port-level modes, ports parsed.
    pub fn port_modes(&self) -> Vec<(u16, MtlsMode)> {
        self.port_level_mtls.iter().filter_map(|(p, m)| Some((p.parse::<u16>().ok()?, m.mode.unwrap_or(MtlsMode::Unset)))).collect()
    }
}

pub fn peer_authentication(o: &KeptObject) -> Result<PeerAuthenticationSpec, Vec<FieldError>> {
    let spec: PeerAuthenticationSpec = serde_path_to_error::deserialize(o.spec.clone()).map_err(|e| {
        vec![FieldError { field: format!("spec.{}", e.path()).trim_end_matches('.').to_string(), message: e.into_inner().to_string() }]
    })?;
    let mut errors = Vec::new();
    for p in spec.port_level_mtls.keys() {
        if !p.parse::<u16>().is_ok_and(|n| n > 0) {
            errors.push(FieldError {
                field: format!("spec.portLevelMtls[{p}]"),
                message: "must be a port number between 1 and 65535".into(),
            });
        }
    }
    if !spec.port_level_mtls.is_empty() && spec.selector.as_ref().is_none_or(|s| s.match_labels.is_empty()) {
        errors.push(FieldError {
            field: "spec.portLevelMtls".into(),
            message: "needs spec.selector (port-level settings apply to selected workloads only, as in Istio)".into(),
        });
    }
    if let Some(s) = &spec.selector {
        if !s.match_expressions.is_empty() {
            errors.push(FieldError { field: "spec.selector.matchExpressions".into(), message: "not supported; use matchLabels".into() });
        }
    }
    if errors.is_empty() {
        Ok(spec)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use crate::load::{load_str, Source};

    fn load(spec: &str) -> Result<(), String> {
        let y =
            format!("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: pa, namespace: demo}}\nspec: {spec}\n");
        load_str(&y, &Source("pa.yaml".into())).map(|_| ()).map_err(|e| e.to_string())
    }

    #[test]
    fn modes_and_ports() {
        assert!(load("{mtls: {mode: STRICT}}").is_ok());
        assert!(load("{selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {9000: {mode: PERMISSIVE}}}").is_ok());
        let e = load("{mtls: {mode: STRICTEST}}").unwrap_err();
        assert!(e.contains("PeerAuthentication demo/pa: spec.mtls.mode: unknown variant `STRICTEST`"), "{e}");
        let e = load("{mtls: {mode: STRICT}, portLevelMtls: {9000: {mode: PERMISSIVE}}}").unwrap_err();
        assert!(e.contains("spec.portLevelMtls: needs spec.selector"), "{e}");
        let e = load("{selector: {matchLabels: {app: a}}, portLevelMtls: {http: {mode: PERMISSIVE}}}").unwrap_err();
        assert!(e.contains("spec.portLevelMtls[http]: must be a port number"), "{e}");
    }
}
