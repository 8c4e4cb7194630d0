//! The commands that inspect the mesh (`status`, `proxy-status`,
//! `proxy-config`, `policy check`, `observe`, `x waypoint`) against a
//! Kubernetes install instead of the local cluster (issue 39): which one
//! ([`target`]), how its processes are reached (through the API server:
//! [`reach`], [`http`]), and one adapter per command that shows what it
//! finds with the local commands' own code and schema.

pub mod accesslog;
pub mod http;
pub mod install;
pub mod observe;
pub mod proxies;
pub mod reach;
pub mod status;
pub mod status_map;
pub mod target;
pub mod waypoint;
