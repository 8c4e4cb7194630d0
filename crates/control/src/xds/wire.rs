//! A `DeltaDiscoveryResponse` as the server sends it: its resources are
//! the store's own [`Versioned`] values, each already encoded once
//! ([`Versioned::encoded`]), so a response to a hundred proxies is a
//! hundred lists of pointers and a hundred copies of bytes into the
//! transport, not a hundred deep copies of every resource (names,
//! versions, bodies) followed by a hundred encodings.
//!
//! [`Outgoing`] implements `prost::Message` by hand for that: the bytes
//! it writes are exactly the generated `DeltaDiscoveryResponse`'s (field
//! numbers of docs/protocols.md section 4; the unit tests below decode
//! them with the generated type). Within each `Resource`, the name
//! (field 3) follows version and body (fields 1 and 2): protobuf readers
//! accept fields in any order, and the name is the only per-response
//! part.

use crate::resources::Versioned;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, skip_field, DecodeContext, WireType};
use prost::DecodeError;
use slipstream_api::discovery::DeltaDiscoveryResponse;
use slipstream_api::TypeUrl;
use std::sync::Arc;

const SYSTEM_VERSION_INFO: u32 = 1;
const RESOURCES: u32 = 2;
const TYPE_URL: u32 = 4;
const NONCE: u32 = 5;
const REMOVED_RESOURCES: u32 = 6;
/// `Resource.name`.
const RESOURCE_NAME: u32 = 3;

/// One response of a delta stream, ready to encode.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub system_version_info: String,
    pub type_url: TypeUrl,
    pub nonce: String,
    /// Each resource sent, by name.
    pub resources: Vec<(Arc<str>, Arc<Versioned>)>,
    pub removed_resources: Vec<String>,
}

impl Outgoing {
    /// The response as the generated message (tests, logs): what a proxy
    /// decodes from the bytes [`Outgoing`] writes.
    pub fn to_message(&self) -> DeltaDiscoveryResponse {
        <DeltaDiscoveryResponse as prost::Message>::decode(prost::Message::encode_to_vec(self).as_slice())
            .expect("Outgoing writes a valid DeltaDiscoveryResponse")
    }

    /// The names of the resources sent, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.resources.iter().map(|(n, _)| &**n)
    }
}

fn string_len(tag: u32, s: &str) -> usize {
    key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
}

fn put_string(tag: u32, s: &str, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(s.len() as u64, buf);
    buf.put_slice(s.as_bytes());
}

/// Length of one `Resource` message, without its own key and length.
fn resource_len(name: &str, v: &Versioned) -> usize {
    v.encoded.len() + string_len(RESOURCE_NAME, name)
}

impl Outgoing {
    /// Fields before the resources.
    fn put_head(&self, buf: &mut impl BufMut) {
        if !self.system_version_info.is_empty() {
            put_string(SYSTEM_VERSION_INFO, &self.system_version_info, buf);
        }
    }

    fn put_resource(name: &str, v: &Versioned, buf: &mut impl BufMut) {
        encode_key(RESOURCES, WireType::LengthDelimited, buf);
        encode_varint(resource_len(name, v) as u64, buf);
        buf.put_slice(&v.encoded);
        put_string(RESOURCE_NAME, name, buf);
    }

    /// Fields after the resources.
    fn put_tail(&self, buf: &mut impl BufMut) {
        put_string(TYPE_URL, self.type_url.as_str(), buf);
        if !self.nonce.is_empty() {
            put_string(NONCE, &self.nonce, buf);
        }
        for r in &self.removed_resources {
            put_string(REMOVED_RESOURCES, r, buf);
        }
    }

    /// The response as a gRPC message (5-byte prefix, then the message),
    /// written piece by piece: see [`Frames`].
    pub fn into_frames(self, chunk: usize) -> Frames {
        Frames { out: self, next: 0, started: false, done: false, chunk }
    }
}

/// A response encoded as it is sent, about `chunk` bytes at a time: the
/// stream's memory is one chunk, not the whole response (which, for a
/// first push, is megabytes that an encoder would otherwise keep as its
/// buffer for as long as the stream lives).
pub struct Frames {
    out: Outgoing,
    /// Next resource to write.
    next: usize,
    started: bool,
    done: bool,
    chunk: usize,
}

impl Frames {
    /// The next piece of the gRPC message, or None when it is all written.
    pub fn next_chunk(&mut self) -> Option<prost::bytes::Bytes> {
        if self.done {
            return None;
        }
        let mut buf = prost::bytes::BytesMut::with_capacity(self.chunk + 256);
        if !self.started {
            self.started = true;
            let len = prost::Message::encoded_len(&self.out);
            let len = u32::try_from(len).expect("a response fits a gRPC message (4 GiB)");
            buf.put_u8(0); // not compressed
            buf.put_u32(len);
            self.out.put_head(&mut buf);
        }
        while self.next < self.out.resources.len() && buf.len() < self.chunk {
            let (name, v) = &self.out.resources[self.next];
            Outgoing::put_resource(name, v, &mut buf);
            self.next += 1;
        }
        if self.next == self.out.resources.len() && buf.len() < self.chunk {
            self.out.put_tail(&mut buf);
            self.done = true;
        }
        Some(buf.freeze())
    }
}

impl prost::Message for Outgoing {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.put_head(buf);
        for (name, v) in &self.resources {
            Outgoing::put_resource(name, v, buf);
        }
        self.put_tail(buf);
    }

    fn merge_field(&mut self, tag: u32, wire_type: WireType, buf: &mut impl Buf, ctx: DecodeContext) -> Result<(), DecodeError> {
        // Only ever encoded: a server does not read its own responses.
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let mut n = 0;
        if !self.system_version_info.is_empty() {
            n += string_len(SYSTEM_VERSION_INFO, &self.system_version_info);
        }
        for (name, v) in &self.resources {
            let len = resource_len(name, v);
            n += key_len(RESOURCES) + encoded_len_varint(len as u64) + len;
        }
        n += string_len(TYPE_URL, self.type_url.as_str());
        if !self.nonce.is_empty() {
            n += string_len(NONCE, &self.nonce);
        }
        n += self.removed_resources.iter().map(|r| string_len(REMOVED_RESOURCES, r)).sum::<usize>();
        n
    }

    fn clear(&mut self) {
        self.system_version_info.clear();
        self.nonce.clear();
        self.resources.clear();
        self.removed_resources.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use slipstream_api::discovery::Resource;

    fn resource(body: &[u8]) -> Arc<Versioned> {
        Arc::new(Versioned::new(prost_types::Any { type_url: TypeUrl::Address.as_str().into(), value: body.to_vec() }))
    }

    #[test]
    fn decodes_as_the_generated_message_and_has_its_length() {
        let a = resource(b"first body");
        let b = resource(&[7u8; 300]);
        let out = Outgoing {
            system_version_info: "42".into(),
            type_url: TypeUrl::Address,
            nonce: "42.7".into(),
            resources: vec![("uid-a".into(), a.clone()), (Arc::from("x".repeat(200)), b.clone())],
            removed_resources: vec!["gone".into(), "also/gone".into()],
        };
        let bytes = out.encode_to_vec();
        assert_eq!(bytes.len(), out.encoded_len());
        let want = DeltaDiscoveryResponse {
            system_version_info: "42".into(),
            resources: vec![
                Resource { name: "uid-a".into(), version: a.version.to_string(), resource: Some(a.body.clone()), ..Default::default() },
                Resource { name: "x".repeat(200), version: b.version.to_string(), resource: Some(b.body.clone()), ..Default::default() },
            ],
            type_url: TypeUrl::Address.as_str().into(),
            removed_resources: vec!["gone".into(), "also/gone".into()],
            nonce: "42.7".into(),
        };
        assert_eq!(DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap(), want);
        assert_eq!(out.to_message(), want);
        // Same length as the generated encoding: only the order of fields
        // inside each resource differs.
        assert_eq!(bytes.len(), want.encoded_len());
    }

    #[test]
    fn frames_carry_the_same_message_in_pieces_of_about_the_chunk() {
        let resources: Vec<_> = (0..500).map(|i| (Arc::<str>::from(format!("name-{i}")), resource(&[i as u8; 100]))).collect();
        let out = Outgoing {
            system_version_info: "3".into(),
            type_url: TypeUrl::Address,
            nonce: "3.1".into(),
            resources,
            removed_resources: vec!["gone".into()],
        };
        let whole = out.encode_to_vec();
        for chunk in [1, 1000, 4096, 1 << 20] {
            let mut frames = out.clone().into_frames(chunk);
            let mut pieces = Vec::new();
            while let Some(p) = frames.next_chunk() {
                pieces.push(p);
            }
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert_eq!(joined[0], 0, "chunk {chunk}: not compressed");
            assert_eq!(u32::from_be_bytes(joined[1..5].try_into().unwrap()) as usize, whole.len(), "chunk {chunk}: length prefix");
            assert_eq!(&joined[5..], whole.as_slice(), "chunk {chunk}: the same bytes");
            // Each piece but the last stops at the first resource past the chunk.
            let biggest = pieces.iter().map(|p| p.len()).max().unwrap();
            assert!(biggest < chunk.max(1) + 200 + 5 + 10, "chunk {chunk}: a piece of {biggest} bytes");
            if chunk >= whole.len() {
                assert_eq!(pieces.len(), 1);
            }
        }
    }

    #[test]
    fn an_empty_response_still_names_its_type() {
        let out = Outgoing {
            system_version_info: String::new(),
            type_url: TypeUrl::Authorization,
            nonce: String::new(),
            resources: vec![],
            removed_resources: vec![],
        };
        let m = out.to_message();
        assert_eq!(m.type_url, TypeUrl::Authorization.as_str());
        assert!(m.resources.is_empty() && m.removed_resources.is_empty());
    }
}
