//! The mesh-wide settings for waypoints (`slipstream.mesh.v1.MeshSettings`)
//! to and from the model's [`MeshSettings`]. An enum value this version does
//! not know is an error naming the field, so the waypoint NACKs the
//! resource rather than guess.

use crate::convert::ConvertError;
use crate::meshpb as pb;
use prost::Message;
use slipstream_core::mesh::{MeshSettings, PathNormalization};

fn err(field: &str, message: impl Into<String>) -> ConvertError {
    ConvertError { field: field.into(), message: message.into() }
}

pub fn mesh_any(m: &MeshSettings) -> prost_types::Any {
    let path_normalization = match m.path_normalization {
        PathNormalization::None => pb::PathNormalization::None,
        PathNormalization::Base => pb::PathNormalization::Base,
        PathNormalization::MergeSlashes => pb::PathNormalization::MergeSlashes,
        PathNormalization::DecodeAndMergeSlashes => pb::PathNormalization::DecodeAndMergeSlashes,
    };
    let msg = pb::MeshSettings { path_normalization: path_normalization as i32, num_trusted_proxies: m.num_trusted_proxies };
    prost_types::Any { type_url: crate::MESH_TYPE_URL.to_string(), value: msg.encode_to_vec() }
}

/// Unpacks the mesh-settings resource, checking its type URL.
pub fn mesh_from_any(any: &prost_types::Any) -> Result<MeshSettings, ConvertError> {
    if any.type_url != crate::MESH_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::MESH_TYPE_URL, any.type_url)));
    }
    let m = pb::MeshSettings::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not a MeshSettings: {e}")))?;
    let path_normalization = match pb::PathNormalization::try_from(m.path_normalization) {
        Ok(pb::PathNormalization::Default | pb::PathNormalization::Base) => PathNormalization::Base,
        Ok(pb::PathNormalization::None) => PathNormalization::None,
        Ok(pb::PathNormalization::MergeSlashes) => PathNormalization::MergeSlashes,
        Ok(pb::PathNormalization::DecodeAndMergeSlashes) => PathNormalization::DecodeAndMergeSlashes,
        Err(_) => return Err(err("path_normalization", format!("{} is not a normalization this version knows", m.path_normalization))),
    };
    Ok(MeshSettings { path_normalization, num_trusted_proxies: m.num_trusted_proxies })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_unknown_values_are_refused() {
        for path_normalization in
            [PathNormalization::None, PathNormalization::Base, PathNormalization::MergeSlashes, PathNormalization::DecodeAndMergeSlashes]
        {
            let m = MeshSettings { path_normalization, num_trusted_proxies: 2 };
            assert_eq!(mesh_from_any(&mesh_any(&m)), Ok(m));
        }
        let unknown = pb::MeshSettings { path_normalization: 9, num_trusted_proxies: 0 };
        let any = prost_types::Any { type_url: crate::MESH_TYPE_URL.into(), value: unknown.encode_to_vec() };
        assert_eq!(mesh_from_any(&any).unwrap_err().field, "path_normalization");
        // Empty bytes: Istio's defaults.
        let empty = prost_types::Any { type_url: crate::MESH_TYPE_URL.into(), value: vec![] };
        assert_eq!(mesh_from_any(&empty), Ok(MeshSettings::default()));
    }
}
