//! The simulated node proxies of `bench-control`: each a real delta xDS
//! client over its own TLS connection (the node proxy's `ControlChannel`:
//! the mesh root, the control plane's name, its own node token), speaking
//! for its own node, subscribing to both types by wildcard and ACKing
//! every response, as the node proxy does.
//!
//! What it does not do is what the node proxy does with a response
//! (convert and index it): the simulated proxies share the bench
//! process's cores with nothing but each other, and the figures are the
//! control plane's. Responses are decoded only as far as the bench needs
//! (type, nonce, resource names); each response's size is the length of
//! its gRPC message, which is the `encoded_len` of the whole response.

use slipstream_api::discovery::DeltaDiscoveryRequest;
use slipstream_api::TypeUrl;
use slipstream_proxy::control::ControlChannel;
use slipstream_proxy::xds::NodeInfo;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder};

const METHOD: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// Largest response accepted (the node proxy's bound).
const MAX_RESPONSE_BYTES: usize = 128 << 20;
/// Responses with at most this many resources report their names (a
/// change); larger ones (the first push) only their count.
const NAMES_UP_TO: usize = 64;

/// The fields of a `DeltaDiscoveryResponse` the bench reads; prost skips
/// the others (the resources' bodies) without copying them.
#[derive(Clone, PartialEq, prost::Message)]
struct LiteResponse {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<LiteResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
    #[prost(string, repeated, tag = "6")]
    removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LiteResource {
    #[prost(string, tag = "3")]
    name: String,
}

/// Requests encoded as usual; responses decoded lite, with their size.
#[derive(Debug, Clone, Copy, Default)]
struct BenchCodec;

struct SizedDecoder;

impl Decoder for SizedDecoder {
    type Item = (usize, LiteResponse);
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, tonic::Status> {
        // The buffer holds exactly one message.
        let len = prost::bytes::Buf::remaining(buf);
        let msg = <LiteResponse as prost::Message>::decode(buf).map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(Some((len, msg)))
    }
}

impl Codec for BenchCodec {
    type Encode = DeltaDiscoveryRequest;
    type Decode = (usize, LiteResponse);
    type Encoder = tonic_prost::ProstEncoder<DeltaDiscoveryRequest>;
    type Decoder = SizedDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        SizedDecoder
    }
}

/// What a proxy saw, stamped when it saw it.
#[derive(Debug)]
pub enum Note {
    Response(Received),
    /// The stream ended (the bench treats it as a failure).
    Ended {
        proxy: usize,
        why: String,
    },
}

/// One response.
#[derive(Debug)]
pub struct Received {
    pub proxy: usize,
    pub at: Instant,
    pub type_url: Option<TypeUrl>,
    /// The response's encoded length.
    pub bytes: usize,
    pub resources: usize,
    pub removed: usize,
    /// The resources' names, for responses of up to `NAMES_UP_TO`.
    pub names: Vec<String>,
}

/// Runs proxy `proxy` until its stream ends or the notes' receiver goes.
pub async fn run(proxy: usize, channel: ControlChannel, node: NodeInfo, notes: mpsc::UnboundedSender<Note>) {
    let why = match stream(proxy, &channel, &node, &notes).await {
        Ok(()) => "the control plane ended the stream".to_string(),
        Err(e) => e,
    };
    let _ = notes.send(Note::Ended { proxy, why });
}

async fn stream(proxy: usize, channel: &ControlChannel, node: &NodeInfo, notes: &mpsc::UnboundedSender<Note>) -> Result<(), String> {
    let (requests, rx) = mpsc::channel(8);
    for t in TypeUrl::NODE {
        let first = DeltaDiscoveryRequest { node: Some(node.node()), type_url: t.as_str().into(), ..Default::default() };
        requests.try_send(first).map_err(|e| e.to_string())?;
    }
    let req = channel.request(ReceiverStream::new(rx)).map_err(|e| e.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready().await.map_err(|e| format!("connecting: {e}"))?;
    let path = http::uri::PathAndQuery::from_static(METHOD);
    let mut responses = grpc.streaming(req, path, BenchCodec).await.map_err(|s| describe(&s))?.into_inner();
    loop {
        let Some((bytes, resp)) = responses.message().await.map_err(|s| describe(&s))? else { return Ok(()) };
        let at = Instant::now();
        let names = if resp.resources.len() <= NAMES_UP_TO { resp.resources.iter().map(|r| r.name.clone()).collect() } else { Vec::new() };
        let note = Received {
            proxy,
            at,
            type_url: TypeUrl::parse(&resp.type_url),
            bytes,
            resources: resp.resources.len(),
            removed: resp.removed_resources.len(),
            names,
        };
        if notes.send(Note::Response(note)).is_err() {
            return Ok(());
        }
        let ack = DeltaDiscoveryRequest { type_url: resp.type_url, response_nonce: resp.nonce, ..Default::default() };
        requests.send(ack).await.map_err(|_| "the request stream closed".to_string())?;
    }
}

fn describe(s: &tonic::Status) -> String {
    let mut out = format!("{}: {}", s.code(), s.message());
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        out.push_str(&format!(": {e}"));
        source = e.source();
    }
    out
}
