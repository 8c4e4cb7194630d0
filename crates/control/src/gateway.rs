//! Istio's gateway controller, for waypoints: what a Gateway of class
//! `istio-waypoint` makes ([`render`]: ServiceAccount, Deployment, Service,
//! owned by the Gateway) and the status Istio writes ([`status`]: the
//! Gateway's `Accepted`, `Programmed` and `addresses`, the Services'
//! `istio.io/WaypointBound`), both pure; [`controller`] applies them
//! through the Kubernetes API; [`genuine`] says whether a pod runs the
//! rendered template, which is what makes it one of a waypoint's. The local cluster's agent uses the same
//! status function for what `get` serves.

pub mod controller;
pub mod genuine;
pub mod render;
pub mod status;

/// The string at a JSON pointer of an object as the API serves it, or ""
/// (the three modules read objects as JSON, not typed).
pub(crate) fn str_at<'a>(o: &'a serde_json::Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(serde_json::Value::as_str).unwrap_or("")
}
