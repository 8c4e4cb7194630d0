//! The `AggregatedDiscoveryService` route, written out instead of
//! generated. The generated server sends the generated
//! `DeltaDiscoveryResponse`: every stream would deep-copy each resource it
//! sends, then encode the whole response into a buffer that the stream
//! keeps (at its largest size, a first push's megabytes) for as long as
//! it lives. This one sends [`Outgoing`], whose resources are the store's
//! already-encoded bytes (`super::wire`), and writes each response into
//! the HTTP/2 stream a chunk at a time, as flow control lets it go.
//! Requests are decoded by tonic with the generated types as usual. Same
//! service name, method path and wire format; the service's other methods
//! (state-of-the-world ADS) answer UNIMPLEMENTED, as before. Responses are
//! not compressed (nor were they).

use super::wire::{Frames, Outgoing};
use super::XdsServer;
use hyper::body::Frame;
use slipstream_api::discovery::DeltaDiscoveryRequest;
use tokio::sync::mpsc;
use tonic::codec::Codec;
use tonic::codegen::{http, Body, BoxFuture, Bytes, Context, Pin, Poll, Service, StdError};
use tonic::server::NamedService;
use tonic::{Request, Status, Streaming};

/// The service's gRPC name.
pub const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// The one method served.
pub const DELTA_METHOD: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The route: `DeltaAggregatedResources` of the ADS service.
#[derive(Clone)]
pub struct AdsService {
    server: XdsServer,
    max_request_bytes: usize,
}

impl AdsService {
    pub(super) fn new(server: XdsServer, max_request_bytes: usize) -> Self {
        AdsService { server, max_request_bytes }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE;
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != DELTA_METHOD {
            let path = req.uri().path().to_string();
            return Box::pin(async move { Ok(Status::unimplemented(format!("{path} is not served here")).into_http()) });
        }
        if let Some(enc) = req.headers().get("grpc-encoding").filter(|e| e.as_bytes() != b"identity") {
            let msg = format!("requests compressed with {enc:?} are not accepted: send them uncompressed");
            return Box::pin(async move { Ok(Status::unimplemented(msg).into_http()) });
        }
        let server = self.server.clone();
        let max = self.max_request_bytes;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let decoder = tonic_prost::ProstCodec::<Outgoing, DeltaDiscoveryRequest>::default().decoder();
            let inbound = Streaming::new_request(decoder, body, None, Some(max));
            let request = Request::from_http(http::Request::from_parts(parts, inbound));
            let response = match server.open(request).await {
                Ok(r) => r,
                Err(status) => return Ok(status.into_http()),
            };
            let (metadata, rx, extensions) = response.into_parts();
            let mut http = http::Response::new(tonic::body::Body::new(ResponseBody::new(rx)));
            *http.headers_mut() = metadata.into_headers();
            *http.extensions_mut() = extensions;
            http.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            Ok(http)
        })
    }
}

/// A response body of about this many bytes is produced at a time.
const CHUNK: usize = 64 << 10;

/// The body of a stream's HTTP response: each response the stream task
/// sends, as a gRPC message written a chunk at a time (only when the
/// transport asks for more, so within HTTP/2 flow control), then the
/// trailers with the status the stream ended with.
struct ResponseBody {
    rx: mpsc::Receiver<Result<Outgoing, Status>>,
    current: Option<Frames>,
    done: bool,
}

impl ResponseBody {
    fn new(rx: mpsc::Receiver<Result<Outgoing, Status>>) -> Self {
        ResponseBody { rx, current: None, done: false }
    }

    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            // Only a message that is not a valid header value fails.
            let _ = Status::new(status.code(), "(the message could not be encoded)").add_header(&mut trailers);
        }
        Frame::trailers(trailers)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let me = &mut *self;
        loop {
            if me.done {
                return Poll::Ready(None);
            }
            if let Some(frames) = &mut me.current {
                if let Some(chunk) = frames.next_chunk() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                me.current = None;
            }
            match me.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(out))) => me.current = Some(out.into_frames(CHUNK)),
                Poll::Ready(Some(Err(status))) => {
                    me.done = true;
                    return Poll::Ready(Some(Ok(ResponseBody::trailers(&status))));
                }
                Poll::Ready(None) => {
                    me.done = true;
                    return Poll::Ready(Some(Ok(ResponseBody::trailers(&Status::ok("")))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
