//! `slipstream debug hold`: opens many TCP connections to an echo server at
//! once, checks that each echoes its own bytes, holds them all open, then
//! closes them together. One JSON line when all are open, one when closed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use futures_util::stream::{self, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{parse_flag, parse_mark};

/// Flags of `slipstream debug hold`.
#[derive(clap::Args, Debug, Clone)]
pub struct HoldArgs {
    /// The echo server.
    #[arg(long, value_name = "IP:PORT")]
    pub to: SocketAddr,
    /// How many connections to hold at once.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// How many may be opening at the same time.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Bytes each connection sends and expects back (at least 9: its number
    /// is in them).
    #[arg(long, default_value_t = 16)]
    pub payload: usize,
    /// How long to hold the connections once all are open.
    #[arg(long, default_value = "0s", value_parser = parse_flag)]
    pub hold: Duration,
    /// Hold until standard input is closed (after --hold).
    #[arg(long)]
    pub wait_stdin: bool,
    /// Budget for connecting and echoing, per connection.
    #[arg(long, default_value = "20s", value_parser = parse_flag)]
    pub timeout: Duration,
    /// Socket mark (0x539 bypasses a meshed pod's capture).
    #[arg(long, default_value = "0", value_parser = parse_mark)]
    pub mark: u32,
}

/// How many failures are reported by their message.
const SHOWN_ERRORS: usize = 5;

async fn open_one(i: usize, args: &HoldArgs) -> Result<TcpStream, String> {
    let work = async {
        let mut s = super::connect(args.to, args.mark, args.timeout).await?;
        let mut msg = format!("{i:08}:").into_bytes();
        msg.resize(args.payload.max(msg.len()), b'.');
        s.write_all(&msg).await?;
        let mut back = vec![0; msg.len()];
        s.read_exact(&mut back).await?;
        if back != msg {
            return Err(io::Error::other(format!(
                "echo mismatch: sent {:?}, got {:?}",
                String::from_utf8_lossy(&msg),
                String::from_utf8_lossy(&back)
            )));
        }
        Ok(s)
    };
    match tokio::time::timeout(args.timeout, work).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("connection {i}: {e}")),
        Err(_) => Err(format!("connection {i}: no echo within {:?}", args.timeout)),
    }
}

pub async fn run(args: HoldArgs) -> anyhow::Result<()> {
    let limit = slipstream_proxy::sys::rlimit::raise_nofile()?;
    if (limit.soft as usize) < args.connections + 64 {
        bail!("{} connections need more file descriptors than RLIMIT_NOFILE allows ({})", args.connections, limit.soft);
    }
    let start = Instant::now();
    let results: Vec<Result<TcpStream, String>> =
        stream::iter(0..args.connections).map(|i| open_one(i, &args)).buffer_unordered(args.concurrency.max(1)).collect().await;
    let open_ms = start.elapsed().as_millis() as u64;
    let mut held = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    let mut failed = 0usize;
    for r in results {
        match r {
            Ok(s) => held.push(s),
            Err(e) => {
                failed += 1;
                if errors.len() < SHOWN_ERRORS {
                    errors.push(e);
                }
            }
        }
    }
    let ready = serde_json::json!({
        "event": "open",
        "to": args.to.to_string(),
        "connections": args.connections,
        "verified": held.len(),
        "failed": failed,
        "errors": errors,
        "open_ms": open_ms,
        "nofile": limit.soft,
    });
    println!("{ready}");

    tokio::time::sleep(args.hold).await;
    if args.wait_stdin {
        let _ = tokio::task::spawn_blocking(|| std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())).await;
    }
    let held_ms = start.elapsed().as_millis() as u64 - open_ms;
    let count = held.len();
    drop(held);
    println!("{}", serde_json::json!({"event": "closed", "closed": count, "held_ms": held_ms}));
    if failed > 0 {
        bail!("{failed} of {} connections failed; first: {}", args.connections, errors.first().map(String::as_str).unwrap_or(""));
    }
    Ok(())
}
