//! Istio's MeshConfig, where operators put it: the `mesh` key of the
//! `istio` ConfigMap in the root namespace (YAML, istiod's format). The
//! control plane reads the settings its waypoints apply and sends them as
//! one resource (`slipstream.mesh.v1.MeshSettings`): the path
//! normalization (`pathNormalization.normalization`) and the proxies
//! trusted in front of the mesh
//! (`defaultConfig.gatewayTopology.numTrustedProxies`). Every other
//! MeshConfig field is istiod's and left alone; a value that cannot be
//! read is an error naming the field under `data.mesh`, and changes
//! nothing.

use crate::objects::{ObjectError, ObjectRef, OpaqueObject};
use slipstream_core::mesh::{MeshSettings, PathNormalization};

/// The ConfigMap's name (istiod's).
pub const CONFIG_MAP: &str = "istio";
/// Its key holding the MeshConfig.
pub const MESH_KEY: &str = "mesh";

/// Whether `r` is the ConfigMap the mesh's settings come from.
pub fn is_mesh_config(r: &ObjectRef, root_namespace: &str) -> bool {
    r.namespace == root_namespace && r.name == CONFIG_MAP
}

/// The settings of the `istio` ConfigMap `o` (Istio's defaults for what it
/// does not say, or when it has no `mesh` key).
pub fn mesh_settings(o: &OpaqueObject, r: &ObjectRef) -> Result<MeshSettings, ObjectError> {
    let field = |f: &str| format!("data.{MESH_KEY}: {f}");
    let Some(text) = o.rest.get("data").and_then(|d| d.get(MESH_KEY)) else { return Ok(MeshSettings::default()) };
    let text = text.as_str().ok_or_else(|| ObjectError::new(r, format!("data.{MESH_KEY}"), "must be a string (MeshConfig as YAML)"))?;
    let mesh: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ObjectError::new(r, format!("data.{MESH_KEY}"), format!("not YAML (MeshConfig, as istiod reads it): {e}")))?;
    let mut out = MeshSettings::default();
    if let Some(n) = mesh.get("pathNormalization").and_then(|p| p.get("normalization")) {
        out.path_normalization = n.as_str().and_then(PathNormalization::parse).ok_or_else(|| {
            let given = n.as_str().map_or_else(|| serde_yaml::to_string(n).unwrap_or_default().trim().to_string(), |s| format!("{s:?}"));
            ObjectError::new(
                r,
                field("pathNormalization.normalization"),
                format!("{given} is not one of {}", PathNormalization::NAMES.join(", ")),
            )
        })?;
    }
    if let Some(n) = mesh.get("defaultConfig").and_then(|c| c.get("gatewayTopology")).and_then(|t| t.get("numTrustedProxies")) {
        out.num_trusted_proxies = n.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| {
            ObjectError::new(r, field("defaultConfig.gatewayTopology.numTrustedProxies"), "must be a whole number, 0 or more")
        })?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{ClusterObject, Kind};
    use crate::translate::parse_manifests;

    fn settings(mesh: &str) -> Result<MeshSettings, String> {
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{}",
            mesh.lines().map(|l| format!("    {l}\n")).collect::<String>()
        );
        let o = parse_manifests(&yaml).map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))?.remove(0);
        let ClusterObject::Opaque(o) = o else { panic!("a ConfigMap is kept whole") };
        mesh_settings(&o, &ObjectRef::new(Kind::ConfigMap, "istio-system", "istio")).map_err(|e| e.to_string())
    }

    #[test]
    fn the_settings_of_istios_mesh_config_and_errors_naming_the_field() {
        assert_eq!(settings("accessLogFile: /dev/stdout\n"), Ok(MeshSettings::default()), "istiod's other fields are istiod's");
        assert_eq!(
            settings("pathNormalization:\n  normalization: DECODE_AND_MERGE_SLASHES\ndefaultConfig:\n  gatewayTopology:\n    numTrustedProxies: 2\n"),
            Ok(MeshSettings { path_normalization: PathNormalization::DecodeAndMergeSlashes, num_trusted_proxies: 2 })
        );
        assert_eq!(settings("pathNormalization: {normalization: DEFAULT}\n").unwrap().path_normalization, PathNormalization::Base);
        let e = settings("pathNormalization: {normalization: STRICT}\n").unwrap_err();
        assert!(
            e.contains(
                "ConfigMap istio-system/istio: data.mesh: pathNormalization.normalization: \"STRICT\" is not one of DEFAULT, NONE, BASE"
            ),
            "{e}"
        );
        let e = settings("defaultConfig: {gatewayTopology: {numTrustedProxies: -1}}\n").unwrap_err();
        assert!(e.contains("data.mesh: defaultConfig.gatewayTopology.numTrustedProxies: must be a whole number"), "{e}");
        let e = settings("pathNormalization: [\n").unwrap_err();
        assert!(e.contains("data.mesh: not YAML"), "{e}");
    }
}
