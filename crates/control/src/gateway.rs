//! Istio's gateway controller, for waypoints: what a Gateway of class
//! `istio-waypoint` makes ([`render`]: ServiceAccount, Deployment, Service,
//! owned by the Gateway) and the status Istio writes ([`status`]: the
//! Gateway's `Accepted`, `Programmed` and `addresses`, the Services'
//! `istio.io/WaypointBound`), both pure; [`controller`] applies them
//! through the Kubernetes API. The local cluster's agent uses the same
//! status function for what `get` serves.

pub mod controller;
pub mod render;
pub mod status;
