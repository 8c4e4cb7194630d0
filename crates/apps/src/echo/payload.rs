//! The body of `/echo?size=N`: a fixed pattern served from a static buffer,
//! so a 10 MiB answer costs no allocation and no random bytes.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::http::BoxError;

const CHUNK: usize = 64 * 1024;

/// Printable lines of 64 bytes, so `curl` output stays readable.
static PATTERN: [u8; CHUNK] = pattern();

const fn pattern() -> [u8; CHUNK] {
    const LINE: &[u8; 64] = b"slipstream-echo-payload-0123456789-abcdefghijklmnopqrstuvwxyz..\n";
    let mut buf = [0u8; CHUNK];
    let mut i = 0;
    while i < CHUNK {
        buf[i] = LINE[i % LINE.len()];
        i += 1;
    }
    buf
}

/// Exactly `remaining` bytes of [`PATTERN`], in chunks of at most 64 KiB.
/// Its exact size hint makes hyper send `Content-Length`.
pub(crate) struct Payload {
    remaining: u64,
}

impl Payload {
    pub(crate) fn new(size: u64) -> Self {
        Payload { remaining: size }
    }
}

impl Body for Payload {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(CHUNK as u64) as usize;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&PATTERN[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn yields_exactly_the_requested_size() {
        for size in [0u64, 1, 63, 64, CHUNK as u64, CHUNK as u64 + 1, 3 * CHUNK as u64 + 17] {
            let body = Payload::new(size);
            assert_eq!(body.size_hint().exact(), Some(size));
            let bytes = body.collect().await.unwrap().to_bytes();
            assert_eq!(bytes.len() as u64, size);
            assert!(bytes.iter().zip(PATTERN.iter().cycle()).all(|(a, b)| a == b));
        }
    }
}
