//! HTTP/2 settings HBONE peers expect (docs/protocols.md section 2), and the
//! PING keepalive.

use std::time::Duration;

/// The receive window of an HBONE connection its server's memory budget
/// refused the full one: slower (frames split to fit), never refused.
pub const MIN_CONNECTION_WINDOW: u32 = 256 * 1024;

/// HTTP/2 connection settings shared by client and server.
#[derive(Debug, Clone)]
pub struct H2Config {
    /// Per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE).
    pub stream_window: u32,
    /// Connection-level receive window.
    pub connection_window: u32,
    /// The connection window a server gives a connection when its memory
    /// budget refuses the full one ([`MIN_CONNECTION_WINDOW`]).
    pub min_connection_window: u32,
    /// Largest DATA frame we accept (SETTINGS_MAX_FRAME_SIZE).
    pub max_frame_size: u32,
    /// Largest decoded header list we accept (SETTINGS_MAX_HEADER_LIST_SIZE,
    /// counted as RFC 9113 does: name + value + 32 per field); bigger
    /// requests are refused with 431.
    pub max_header_list_size: u32,
    /// Per-stream bytes h2 may queue for sending beyond what was written to
    /// the socket; bounds memory per stream together with flow control.
    pub max_send_buffer: usize,
    /// How often to PING the peer.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
}

impl Default for H2Config {
    fn default() -> Self {
        Self {
            stream_window: 4 * 1024 * 1024,
            connection_window: 16 * 1024 * 1024,
            min_connection_window: MIN_CONNECTION_WINDOW,
            max_frame_size: 1024 * 1024,
            // As ztunnel: a peer's CONNECT with long baggage or forwarded
            // headers must not be refused by one proxy and taken by another.
            max_header_list_size: 64 * 1024,
            max_send_buffer: 1024 * 1024,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

impl H2Config {
    pub(crate) fn client_builder(&self) -> h2::client::Builder {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer)
            // HBONE servers never push.
            .enable_push(false);
        b
    }

    pub(crate) fn server_builder(&self, max_concurrent_streams: u32, connection_window: u32) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.stream_window.min(connection_window))
            .initial_connection_window_size(connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer)
            .max_concurrent_streams(max_concurrent_streams);
        b
    }
}

/// PINGs the peer every `interval`; resolves only if an answer takes longer
/// than `timeout`, at which point the caller drops the connection. If the
/// connection itself fails, never resolves: the connection's own future
/// reports that.
pub(crate) async fn keepalive(mut ping_pong: h2::PingPong, interval: Duration, timeout: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, ping_pong.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_elapsed) => return,
        }
    }
}
