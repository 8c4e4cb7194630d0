//! `slipstream debug tcp`: one plain TCP exchange. Run in a meshed pod it
//! goes through the pod's capture and the node proxies (unless `--mark`
//! makes it bypass them): half-close in either direction, a reader that
//! never reads, or raw bytes at a port that expects TLS.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::time::Instant;

use super::exchange::{self, Payload, Plan};
use super::{parse_flag, parse_mark, parse_size, Output};

/// Flags of `slipstream debug tcp`.
#[derive(clap::Args, Debug, Clone)]
pub struct TcpArgs {
    /// Where to connect.
    #[arg(long, value_name = "IP:PORT")]
    pub to: SocketAddr,
    /// Text to send (escapes `\r`, `\n`, `\t`, `\0` and `\xHH` are understood).
    #[arg(long, value_name = "TEXT", group = "payload")]
    pub send: Option<String>,
    /// Send this many bytes of the pattern `abc...z` (e.g. 64KiB, 256MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, group = "payload")]
    pub send_bytes: Option<u64>,
    /// Shut down our write side after sending.
    #[arg(long)]
    pub half_close: bool,
    /// Read until the server ends its side (or goes idle) before sending.
    #[arg(long, conflicts_with = "no_read")]
    pub recv_first: bool,
    /// Never read: write until flow control stops us for --idle, then keep
    /// the connection open, unread, until --timeout.
    #[arg(long)]
    pub no_read: bool,
    /// Stop reading after this long without a byte; with --no-read, how
    /// long a write may make no progress before we call it stalled.
    #[arg(long, default_value = "1s", value_parser = parse_flag)]
    pub idle: Duration,
    /// Give up (or with --no-read, close) after this long.
    #[arg(long, default_value = "15s", value_parser = parse_flag)]
    pub timeout: Duration,
    /// Socket mark; 0x539 (the node proxy's own) bypasses a meshed pod's
    /// capture.
    #[arg(long, default_value = "0", value_parser = parse_mark)]
    pub mark: u32,
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// `\r`, `\n`, `\t`, `\0`, `\\` and `\xHH`, so that binary can be sent from
/// a command line.
pub fn unescape(s: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'r') => out.push(b'\r'),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'0') => out.push(0),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                let text = std::str::from_utf8(&hex).unwrap_or("");
                let v = u8::from_str_radix(text, 16).with_context(|| format!("bad escape \\x{text} in {s:?}"))?;
                out.push(v);
            }
            other => bail!("unknown escape \\{} in {s:?}", other.map(char::from).unwrap_or(' ')),
        }
    }
    Ok(out)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

/// Connects, runs the exchange, prints it. Fails if the connection could
/// not be made or ended in an error.
pub async fn run(args: TcpArgs) -> anyhow::Result<()> {
    let send = match (&args.send, args.send_bytes) {
        (Some(t), _) => Payload::Bytes(unescape(t)?),
        (None, Some(n)) => Payload::Pattern(n),
        (None, None) => Payload::Bytes(Vec::new()),
    };
    let start = Instant::now();
    let deadline = start + args.timeout;
    let stream = super::connect(args.to, args.mark, args.timeout).await?;
    let plan = Plan { send, half_close: args.half_close, recv_first: args.recv_first, no_read: args.no_read, idle: args.idle, deadline };
    let out = exchange::run(stream, &plan).await;
    match args.output {
        Output::Json => {
            let mut v = serde_json::to_value(&out)?;
            v["to"] = args.to.to_string().into();
            v["data"] = String::from_utf8_lossy(&out.data).into();
            v["hex"] = hex(&out.data[..out.data.len().min(64)]).into();
            v["elapsed_ms"] = (start.elapsed().as_millis() as u64).into();
            println!("{v}");
        }
        Output::Text => {
            println!(
                "{}: sent {} bytes{}, received {} bytes ({:?}{})",
                args.to,
                out.sent,
                if out.half_closed { " and half-closed" } else { "" },
                out.received,
                out.end,
                out.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
            );
            let mut stdout = std::io::stdout();
            let _ = stdout.write_all(&out.data);
            if !out.data.is_empty() && !out.data.ends_with(b"\n") {
                let _ = stdout.write_all(b"\n");
            }
        }
    }
    if out.failed() {
        bail!("{}: {}", args.to, out.error.unwrap_or_default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn unescapes() {
        assert_eq!(unescape(r"GET / HTTP/1.1\r\n\r\n").unwrap(), b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(unescape(r"\x00\xff\\").unwrap(), vec![0, 0xff, b'\\']);
        assert!(unescape(r"\q").is_err());
        assert!(unescape(r"\xzz").is_err());
    }
}
