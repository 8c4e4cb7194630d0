//! The CA material from a Kubernetes Secret (`--ca-secret NAMESPACE/NAME`),
//! laid out as Istio's `cacerts`: `ca-cert.pem` (the signing certificate),
//! `ca-key.pem` (its key), optionally `cert-chain.pem` (the chain up to the
//! root; the signing certificate in it, as Istio's tools put it there, is
//! skipped) and `root-cert.pem` (every root to trust).
//!
//! Absent, it is created with a root generated as `--ca-dir` generates
//! one; when several replicas start at once the first create wins and the
//! others (409 AlreadyExists) read the winner's, so they all sign under
//! one root. A Secret that is there but unusable is a startup error naming
//! it and the key; it is never overwritten.

use super::load::{load_texts, CaTexts, Part};
use crate::namespaced::NamespacedName;
use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use slipstream_core::TrustDomain;
use slipstream_identity::Ca;
use std::collections::BTreeMap;
use std::time::Duration;

/// The signing certificate, optionally followed by its intermediates.
pub const CA_CERT: &str = "ca-cert.pem";
/// Its private key (PEM, PKCS#8 or SEC1).
pub const CA_KEY: &str = "ca-key.pem";
/// The chain from the signing certificate up to the root.
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// Every root the mesh trusts.
pub const ROOT_CERT: &str = "root-cert.pem";

/// How the CA came out of the Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretOrigin {
    /// It was there.
    Read,
    /// It was not: this process generated the root and created it.
    Created,
    /// It was not, and another process created it meanwhile: read.
    ReadAfterRace,
}

/// The Secret's data as the CA's texts, each named by its key and the
/// Secret; a missing required key or text that is not UTF-8 is refused
/// naming both.
pub(crate) fn texts_of(data: &BTreeMap<String, ByteString>, secret: &NamespacedName) -> anyhow::Result<CaTexts> {
    let part = |key: &str| -> anyhow::Result<Option<Part>> {
        let Some(bytes) = data.get(key) else { return Ok(None) };
        let text = String::from_utf8(bytes.0.clone()).map_err(|_| anyhow::anyhow!("Secret {secret}: key {key} is not PEM text"))?;
        Ok(Some(Part { text, what: "key".into(), place: format!("{key} of Secret {secret}") }))
    };
    let required = |key: &str| -> anyhow::Result<Part> {
        part(key)?.ok_or_else(|| {
            let held: Vec<&str> = data.keys().map(String::as_str).collect();
            anyhow::anyhow!(
                "Secret {secret} has no key {key} (it holds: {}). It must hold {CA_CERT} and {CA_KEY}, and may hold {CERT_CHAIN} \
                 and {ROOT_CERT} (Istio's cacerts layout); it is not changed: fix it, or delete it to have a root generated",
                if held.is_empty() { "nothing".to_string() } else { held.join(", ") }
            )
        })
    };
    let cert = required(CA_CERT)?;
    let key = required(CA_KEY)?;
    let chain = part(CERT_CHAIN)?.and_then(|c| without_signing_cert(c, &cert));
    let root_bundle = part(ROOT_CERT)?;
    let keys: Vec<&str> = [CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT].into_iter().filter(|k| data.contains_key(*k)).collect();
    Ok(CaTexts {
        cert,
        key,
        chain,
        root_bundle,
        bundle_hint: ROOT_CERT.into(),
        origin: format!("loading the CA from Secret {secret} (keys {})", keys.join(", ")),
    })
}

/// Istio's `cert-chain.pem` starts with the signing certificate itself;
/// ours is the chain above it. Drops the certificates equal to the signing
/// one (a chain left empty is none). Unparsable text is kept whole: the
/// loader then names it.
fn without_signing_cert(chain: Part, cert: &Part) -> Option<Part> {
    const END: &str = "-----END CERTIFICATE-----";
    let der = |text: &str| -> Option<Vec<u8>> { rustls_pemfile::certs(&mut text.as_bytes()).next()?.ok().map(|c| c.as_ref().to_vec()) };
    let Some(signing) = der(&cert.text) else { return Some(chain) };
    let kept: String = chain.text.split_inclusive(END).filter(|block| der(block).as_ref() != Some(&signing)).collect();
    kept.contains(END).then_some(Part { text: kept, ..chain })
}

/// The data of a Secret holding a generated root.
fn generated_data(ca: &Ca) -> BTreeMap<String, ByteString> {
    let cert = ca.cert_pem();
    [(CA_CERT, cert.clone()), (CA_KEY, ca.key_pem()), (ROOT_CERT, cert)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
        .collect()
}

/// Reads the CA from `secret`, creating it with a generated root if it is
/// absent (create-if-absent: when another process creates it first, its
/// root is read instead). Never changes a Secret that is there.
pub async fn load_or_create(
    client: kube::Client,
    secret: &NamespacedName,
    trust_domain: &TrustDomain,
    needed: Duration,
) -> anyhow::Result<(Ca, SecretOrigin)> {
    let api = Api::<Secret>::namespaced(client, &secret.namespace);
    let read = |s: Secret| -> anyhow::Result<Ca> { load_texts(&texts_of(&s.data.unwrap_or_default(), secret)?, needed) };
    if let Some(s) = api.get_opt(&secret.name).await.with_context(|| format!("reading the CA's Secret {secret}"))? {
        return Ok((read(s)?, SecretOrigin::Read));
    }
    let ca = Ca::generate(trust_domain)?;
    let data = generated_data(&ca);
    let mut new = Secret { data: Some(data.clone()), type_: Some("Opaque".into()), ..Secret::default() };
    new.metadata.name = Some(secret.name.clone());
    new.metadata.labels = Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "slipstream-control".to_string())]));
    match api.create(&PostParams::default(), &new).await {
        Ok(_) => {
            tracing::info!(secret = %secret, "generated the mesh root CA and created its Secret");
            // Loaded back as any replica will read it.
            Ok((load_texts(&texts_of(&data, secret)?, needed)?, SecretOrigin::Created))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!(secret = %secret, "another replica created the CA's Secret first: using its root");
            let s = api.get(&secret.name).await.with_context(|| format!("reading the CA's Secret {secret}"))?;
            Ok((read(s)?, SecretOrigin::ReadAfterRace))
        }
        Err(e) => Err(e).with_context(|| format!("creating the CA's Secret {secret}")),
    }
}

#[cfg(test)]
mod tests;
