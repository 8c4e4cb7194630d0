//! The Kubernetes objects Slipstream's local cluster understands.
//!
//! Pure: YAML text in, typed and validated objects out. Every error names the
//! file, the object and the field, so a user can fix a manifest without
//! guessing. Reading files is the only I/O (`load::load_paths`).
#![forbid(unsafe_code)]

pub mod error;
pub mod expand;
pub mod images;
pub mod istio;
pub mod load;
pub mod names;
pub mod objects;
pub mod security;
pub mod strict;
pub mod validate;

pub use error::{ManifestError, ManifestErrors};
pub use expand::{desired_pods, PodInstance};
pub use load::{load_paths, load_paths_in, load_paths_with, load_str, load_str_in, load_str_with, Source};
pub use objects::*;
pub use security::ContainerSecurity;
pub use strict::FieldValidation;
