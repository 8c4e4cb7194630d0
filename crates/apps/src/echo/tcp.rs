//! The raw TCP echo: every byte back, half-close propagated.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
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

/// Copies until the client half-closes, then finishes writing and shuts our
/// write side down, so the client sees EOF only after all of its bytes.
async fn echo_connection(mut stream: TcpStream) -> io::Result<u64> {
    let (reader, mut writer) = stream.split();
    let mut reader = BufReader::with_capacity(COPY_BUF, reader);
    let copied = tokio::io::copy_buf(&mut reader, &mut writer).await?;
    writer.shutdown().await?;
    Ok(copied)
}
