//! Where objects come from: the Kubernetes API (`kube`) or a directory of
//! manifests (`dir`).

pub mod kube;
