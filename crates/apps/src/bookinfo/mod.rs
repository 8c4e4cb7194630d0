//! `slipstream app bookinfo`: the four services of Istio's bookinfo sample
//! with its call graph: productpage -> details, productpage -> reviews,
//! reviews v2/v3 -> ratings (v1 calls nothing).

mod args;
mod config;
mod data;
mod page;
mod routes;
mod service;
mod upstream;

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

pub use args::{BookinfoArgs, Role};
pub use config::{BookinfoConfig, ConfigError, Upstreams, Version, DEFAULT_PORT};

use crate::net::bind_listener;

/// Serves one bookinfo service on `listener` until dropped.
pub async fn serve_bookinfo(listener: TcpListener, config: BookinfoConfig) {
    let access_log = config.access_log().clone();
    let service = Arc::new(service::Service::new(config));
    crate::http::serve(listener, access_log, move |req, _conn| {
        let service = service.clone();
        async move { service.handle(req).await }
    })
    .await
}

/// Runs `slipstream app bookinfo` until SIGTERM/SIGINT.
pub fn run_bookinfo(args: BookinfoArgs) -> anyhow::Result<()> {
    let config = BookinfoConfig::from_args(&args, |key| std::env::var(key).ok()).context("bookinfo: invalid configuration")?;
    crate::runtime::run_until_signal(async move {
        let listener = bind_listener(args.bind, args.port).await.context("bookinfo: listener")?;
        let upstreams = config.upstreams();
        let calls = match config.role() {
            Role::Productpage => format!(", calls details at {} and reviews at {}", upstreams.details, upstreams.reviews),
            Role::Reviews if config.stars() != config::Stars::None => {
                format!(", calls ratings at {}", upstreams.ratings)
            }
            _ => String::new(),
        };
        println!("bookinfo {} listening on {}{calls}", config.served_by(), listener.local_addr()?);
        serve_bookinfo(listener, config).await;
        Ok(())
    })
}
