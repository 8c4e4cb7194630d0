//! The raw TCP echo: every byte back, half-close propagated. Or, with a
//! banner, the other direction of half-close: the server speaks first,
//! ends its side, and keeps reading.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Per-connection copy buffer: bounded, so a client that writes without
/// reading is held back by TCP flow control instead of growing our memory.
const COPY_BUF: usize = 16 * 1024;

/// Serves the TCP echo on `listener` until dropped, one task per connection.
pub async fn serve_echo_tcp(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(async move {
                    if let Err(err) = echo_connection(stream).await {
                        tracing::debug!(%peer, "tcp echo connection ended with an error: {err}");
                    }
                });
            }
            Err(err) => {
                // Typically EMFILE: wait for connections to close.
                tracing::warn!("tcp echo accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves the banner mode on `listener`: each connection gets `banner`,
/// then our write side is shut down, and everything the client sends
/// afterwards is read and counted; one line per connection on stdout says
/// how much arrived after our half-close.
pub async fn serve_banner_tcp(listener: TcpListener, banner: Arc<[u8]>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let banner = banner.clone();
                tokio::spawn(async move {
                    match banner_connection(stream, &banner).await {
                        Ok(n) => println!("tcp banner: {peer} sent {n} bytes after our half-close, then ended its side"),
                        Err(err) => println!("tcp banner: {peer}: {err}"),
                    }
                });
            }
            Err(err) => {
                tracing::warn!("tcp banner accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn banner_connection(mut stream: TcpStream, banner: &[u8]) -> io::Result<u64> {
    stream.write_all(banner).await?;
    stream.shutdown().await?;
    let mut buf = vec![0u8; COPY_BUF];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf).await? {
            0 => return Ok(total),
            n => total += n as u64,
        }
    }
}

/// Copies until the client half-closes, then finishes writing and shuts our
/// write side down, so the client sees EOF only after all of its bytes.
async fn echo_connection(mut stream: TcpStream) -> io::Result<u64> {
    let (reader, mut writer) = stream.split();
    let mut reader = BufReader::with_capacity(COPY_BUF, reader);
    let copied = tokio::io::copy_buf(&mut reader, &mut writer).await?;
    writer.shutdown().await?;
    Ok(copied)
}
