//! The HBONE client: a pool of mutual-TLS HTTP/2 connections to peer
//! proxies, handing out one CONNECT stream per tunnelled connection.

mod dial;
mod pool;
mod request;

pub use dial::CertSource;
pub use pool::{ConnectionSnapshot, Pool, PoolConfig, PoolSnapshot};
pub use request::{ConnectRequest, PoolKey};
