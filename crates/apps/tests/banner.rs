//! The echo app's banner mode (`--tcp-banner`): the server speaks first,
//! ends its side, and keeps reading what the client sends afterwards.

use std::time::Duration;

use slipstream_apps::serve_banner_tcp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn the_server_half_closes_after_its_banner_and_still_reads() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_banner_tcp(listener, b"hello\n".to_vec().into()));

    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut banner = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut banner)).await.unwrap().unwrap();
    assert_eq!(banner, b"hello\n", "the banner, then end of stream");
    // Our side is still open, and the server still reads: if it had closed
    // fully, these writes would be reset.
    for _ in 0..20 {
        s.write_all(&[b'x'; 4096]).await.unwrap();
    }
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert_eq!(n, 0);
}
