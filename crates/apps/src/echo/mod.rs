//! `slipstream app echo`: an HTTP echo server in the spirit of `fortio
//! server`, plus a raw TCP echo port.

mod handler;
mod params;
mod payload;
mod tcp;

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::http::AccessLog;
use crate::net::bind_listener;

pub use tcp::{serve_banner_tcp, serve_echo_tcp};

/// Command-line flags of `slipstream app echo`.
#[derive(clap::Args, Debug, Clone)]
pub struct EchoArgs {
    /// Port of the HTTP server (HTTP/1.1 and HTTP/2 prior knowledge on the same port).
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    pub http_port: u16,

    /// Port of the raw TCP echo (every byte is sent back); 0 disables it.
    #[arg(long, default_value_t = 9000, value_name = "PORT")]
    pub tcp_port: u16,

    /// Instead of echoing, the TCP port sends TEXT, shuts down its write
    /// side, and keeps reading until the client ends its side (the other
    /// direction of half-close); a line per connection on stdout says how
    /// many bytes arrived after the half-close.
    #[arg(long, value_name = "TEXT")]
    pub tcp_banner: Option<String>,

    /// Address to listen on. `::` is dual-stack and falls back to 0.0.0.0 when IPv6 is unavailable.
    #[arg(long, default_value = "::", value_name = "IP")]
    pub bind: IpAddr,

    /// Server name reported in answers [default: $POD_NAME, else the hostname].
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub name: Option<String>,

    /// Do not log a line per HTTP request.
    #[arg(long)]
    pub quiet: bool,

    /// Also answer `GET /hello` as Istio's helloworld sample does
    /// (`Hello version: VERSION, instance: NAME`).
    #[arg(long, value_name = "VERSION")]
    pub hello_version: Option<String>,

    /// Answer every request with TEXT, as hashicorp's http-echo does.
    #[arg(long, value_name = "TEXT")]
    pub text: Option<String>,
}

/// What the echo HTTP server needs besides its listener.
#[derive(Debug, Clone)]
pub struct EchoConfig {
    /// Reported as `server` in `/headers` and in the `x-served-by` header.
    pub name: String,
    pub access_log: AccessLog,
    /// `/hello` answers with this version (helloworld).
    pub hello_version: Option<String>,
    /// Every request answered with this text (http-echo).
    pub text: Option<String>,
}

/// Serves the echo HTTP endpoints on `listener` until dropped.
pub async fn serve_echo_http(listener: TcpListener, config: EchoConfig) {
    let echo = Arc::new(handler::Echo::new(config.name).with_hello(config.hello_version).with_text(config.text));
    crate::http::serve(listener, config.access_log, move |req, conn| {
        let echo = echo.clone();
        async move { echo.handle(req, conn).await }
    })
    .await
}

/// Runs `slipstream app echo` until SIGTERM/SIGINT.
pub fn run_echo(args: EchoArgs) -> anyhow::Result<()> {
    let name = args.name.clone().filter(|n| !n.trim().is_empty()).unwrap_or_else(hostname);
    let config = EchoConfig {
        name,
        access_log: AccessLog::stdout_unless(args.quiet),
        hello_version: args.hello_version.clone(),
        text: args.text.clone(),
    };
    crate::runtime::run_until_signal(async move {
        // Bind everything before serving anything, so a port conflict fails
        // startup instead of leaving a half-working server.
        let http = bind_listener(args.bind, args.http_port).await.context("echo: HTTP listener")?;
        let tcp = match args.tcp_port {
            0 => None,
            port => Some(bind_listener(args.bind, port).await.context("echo: TCP echo listener")?),
        };
        let tcp_desc = match (&tcp, &args.tcp_banner) {
            (Some(l), Some(_)) => format!("TCP banner on {}", l.local_addr()?),
            (Some(l), None) => format!("TCP echo on {}", l.local_addr()?),
            (None, _) => "TCP echo disabled".to_owned(),
        };
        println!("echo server {:?}: HTTP/1.1 and h2c on {}, {tcp_desc}", config.name, http.local_addr()?);

        let http = serve_echo_http(http, config);
        match tcp {
            Some(tcp) => match args.tcp_banner {
                Some(banner) => {
                    tokio::join!(http, serve_banner_tcp(tcp, banner.into_bytes().into()));
                }
                None => {
                    tokio::join!(http, serve_echo_tcp(tcp));
                }
            },
            None => http.await,
        }
        Ok(())
    })
}

/// The kernel's hostname: in the local cluster every pod sets `POD_NAME`, so
/// this only matters when the app runs outside it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "echo".to_owned())
}
