//! One exchange of bytes over a connection (plain TCP or an HBONE tunnel),
//! driven the way the debug tools need: send and read at once, half-close,
//! read before sending, or write without ever reading.

use std::io;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout_at, Instant};

/// Writes are handed to the connection in pieces of this size.
const CHUNK: usize = 64 * 1024;
/// How many received bytes are kept to be shown.
pub const KEEP: usize = 64 * 1024;

/// What to send: given bytes, or `n` bytes of the `abc...z` pattern made on
/// the fly (so a gigabyte costs no gigabyte of memory).
#[derive(Debug, Clone)]
pub enum Payload {
    Bytes(Vec<u8>),
    Pattern(u64),
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            Payload::Bytes(b) => b.len() as u64,
            Payload::Pattern(n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes at `offset`, at most [`CHUNK`] of them. `scratch` holds
    /// one period more than a chunk of the pattern.
    fn chunk<'a>(&'a self, offset: u64, scratch: &'a [u8]) -> &'a [u8] {
        let left = (self.len() - offset).min(CHUNK as u64) as usize;
        match self {
            Payload::Bytes(b) => &b[offset as usize..offset as usize + left],
            Payload::Pattern(_) => {
                let start = (offset % 26) as usize;
                &scratch[start..start + left]
            }
        }
    }
}

/// How to drive the connection.
#[derive(Debug, Clone)]
pub struct Plan {
    pub send: Payload,
    /// Shut our write side down once everything is sent.
    pub half_close: bool,
    /// Read until the peer ends its side (or goes idle) before sending.
    pub recv_first: bool,
    /// Never read: write until the peer's flow control stops us for
    /// `idle`, then keep the connection open until the deadline.
    pub no_read: bool,
    /// Stop reading after this long without a byte (once all was sent).
    pub idle: Duration,
    pub deadline: Instant,
}

/// Why the exchange stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum End {
    /// The peer ended its side.
    Eof,
    /// Nothing arrived for `idle`.
    Idle,
    /// The deadline passed.
    Timeout,
    /// `no_read`: writes stopped making progress (flow control held us).
    Stalled,
    /// `no_read`: everything was written.
    Sent,
    /// The connection was reset.
    Reset,
    Error,
}

/// What happened.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub sent: u64,
    pub received: u64,
    /// The first [`KEEP`] bytes received.
    #[serde(skip)]
    pub data: Vec<u8>,
    pub end: End,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub half_closed: bool,
}

impl Outcome {
    fn new() -> Self {
        Outcome { sent: 0, received: 0, data: Vec::new(), end: End::Eof, error: None, half_closed: false }
    }

    fn fail(&mut self, e: &io::Error) {
        self.end = match e.kind() {
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted => End::Reset,
            _ => End::Error,
        };
        self.error = Some(e.to_string());
    }

    /// Whether this ended as an error the caller should fail on.
    pub fn failed(&self) -> bool {
        matches!(self.end, End::Reset | End::Error)
    }
}

/// Runs `plan` over `stream`.
pub async fn run<S: AsyncRead + AsyncWrite>(stream: S, plan: &Plan) -> Outcome {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut out = Outcome::new();
    if plan.no_read {
        write_until_stalled(&mut wr, plan, &mut out).await;
        return out;
    }
    if plan.recv_first {
        let (_, done) = watch::channel(true);
        read(&mut rd, plan, &mut out, done).await;
        if !out.failed() && out.end != End::Timeout {
            let mut w = Outcome::new();
            write(&mut wr, plan, &mut w).await;
            out.sent = w.sent;
            out.half_closed = w.half_closed;
            if w.failed() {
                out.end = w.end;
                out.error = w.error;
            }
        }
        return out;
    }
    // Both directions at once, so a large send to an echo cannot deadlock.
    let (done_tx, done_rx) = watch::channel(false);
    let mut w = Outcome::new();
    let writing = async {
        write(&mut wr, plan, &mut w).await;
        let _ = done_tx.send(true);
    };
    tokio::join!(writing, read(&mut rd, plan, &mut out, done_rx));
    out.sent = w.sent;
    out.half_closed = w.half_closed;
    if w.failed() && !out.failed() {
        out.end = w.end;
        out.error = w.error;
    }
    out
}

fn scratch(plan: &Plan) -> Vec<u8> {
    match plan.send {
        Payload::Pattern(_) => super::pattern(CHUNK as u64 + 26),
        Payload::Bytes(_) => Vec::new(),
    }
}

async fn write<W: AsyncWrite + Unpin>(wr: &mut W, plan: &Plan, out: &mut Outcome) {
    let scratch = scratch(plan);
    while out.sent < plan.send.len() {
        let chunk = plan.send.chunk(out.sent, &scratch);
        match timeout_at(plan.deadline, wr.write(chunk)).await {
            Ok(Ok(0)) => return out.fail(&io::Error::new(io::ErrorKind::WriteZero, "the connection takes no more bytes")),
            Ok(Ok(n)) => out.sent += n as u64,
            Ok(Err(e)) => return out.fail(&e),
            Err(_) => {
                out.end = End::Timeout;
                return;
            }
        }
    }
    let flushed = match wr.flush().await {
        Ok(()) if plan.half_close => wr.shutdown().await,
        r => r,
    };
    match flushed {
        Ok(()) => out.half_closed = plan.half_close,
        Err(e) => out.fail(&e),
    }
}

async fn write_until_stalled<W: AsyncWrite + Unpin>(wr: &mut W, plan: &Plan, out: &mut Outcome) {
    let scratch = scratch(plan);
    while out.sent < plan.send.len() {
        let chunk = plan.send.chunk(out.sent, &scratch);
        let patience = (Instant::now() + plan.idle).min(plan.deadline);
        match timeout_at(patience, wr.write(chunk)).await {
            Ok(Ok(0)) => return out.fail(&io::Error::new(io::ErrorKind::WriteZero, "the connection takes no more bytes")),
            Ok(Ok(n)) => out.sent += n as u64,
            Ok(Err(e)) => return out.fail(&e),
            Err(_) if Instant::now() >= plan.deadline => {
                out.end = End::Timeout;
                return;
            }
            Err(_) => {
                // Held back by flow control: keep the connection, unread,
                // until the deadline.
                out.end = End::Stalled;
                sleep_until(plan.deadline).await;
                return;
            }
        }
    }
    out.end = End::Sent;
    if plan.half_close {
        match wr.shutdown().await {
            Ok(()) => out.half_closed = true,
            Err(e) => out.fail(&e),
        }
    }
    sleep_until(plan.deadline).await;
}

/// Reads until end of stream, an error, the deadline, or `idle` without a
/// byte once `writing_done` says everything was sent.
async fn read<R: AsyncRead + Unpin>(rd: &mut R, plan: &Plan, out: &mut Outcome, mut writing_done: watch::Receiver<bool>) {
    let mut buf = vec![0u8; CHUNK];
    let mut sent_all = *writing_done.borrow();
    loop {
        let idle = tokio::time::sleep(plan.idle);
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) => {
                    out.end = End::Eof;
                    return;
                }
                Ok(n) => {
                    out.received += n as u64;
                    let keep = n.min(KEEP.saturating_sub(out.data.len()));
                    out.data.extend_from_slice(&buf[..keep]);
                }
                Err(e) => return out.fail(&e),
            },
            _ = idle, if sent_all => {
                out.end = End::Idle;
                return;
            }
            _ = sleep_until(plan.deadline) => {
                out.end = End::Timeout;
                return;
            }
            // A closed channel (the writer is gone) also means "done".
            _ = writing_done.changed(), if !sent_all => sent_all = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    fn plan(send: Payload) -> Plan {
        Plan {
            send,
            half_close: false,
            recv_first: false,
            no_read: false,
            idle: Duration::from_millis(200),
            deadline: Instant::now() + Duration::from_secs(5),
        }
    }

    /// An echo that half-closes after its client does.
    fn echo(s: tokio::io::DuplexStream) {
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(s);
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }

    #[tokio::test]
    async fn half_close_gets_the_echo_then_eof() {
        let (a, b) = duplex(1024);
        echo(b);
        let p = Plan { half_close: true, ..plan(Payload::Pattern(300_000)) };
        let o = run(a, &p).await;
        assert_eq!((o.sent, o.received, o.end, o.half_closed), (300_000, 300_000, End::Eof, true));
        assert_eq!(&o.data[..30], &super::super::pattern(30)[..]);
    }

    #[tokio::test]
    async fn without_half_close_stops_when_idle() {
        let (a, b) = duplex(1024);
        echo(b);
        let o = run(a, &plan(Payload::Bytes(b"hello".to_vec()))).await;
        assert_eq!((o.received, o.end, o.data.as_slice()), (5, End::Idle, &b"hello"[..]));
    }

    #[tokio::test]
    async fn recv_first_reads_a_banner_then_sends() {
        let (a, b) = duplex(1024);
        let server = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(b);
            w.write_all(b"banner").await.unwrap();
            w.shutdown().await.unwrap();
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        });
        let p = Plan { recv_first: true, half_close: true, ..plan(Payload::Bytes(b"ping".to_vec())) };
        let o = run(a, &p).await;
        assert_eq!((o.data.as_slice(), o.end, o.sent), (&b"banner"[..], End::Eof, 4));
        assert_eq!(server.await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn no_read_stalls_on_flow_control() {
        let (a, _b) = duplex(64 * 1024);
        let p = Plan { no_read: true, deadline: Instant::now() + Duration::from_millis(600), ..plan(Payload::Pattern(10 << 20)) };
        let o = run(a, &p).await;
        assert_eq!(o.end, End::Stalled);
        assert_eq!(o.sent, 64 * 1024, "exactly the buffer's worth went out");
    }
}
