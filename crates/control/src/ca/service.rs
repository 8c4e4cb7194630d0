//! `istio.v1.auth.IstioCertificateService/CreateCertificate`
//! (docs/protocols.md section 3): who is calling, what they ask for,
//! whether they may have it, then the signature.
//!
//! The decision ([`decide`]) is pure: caller, CSR and metadata in, the
//! identity to sign or a [`Refusal`] out. [`CaService`] does the I/O
//! around it: authentication, per-caller bounds, signing, logging.

use super::limits::{CallerLimits, Limited, Limits, LogDecision, Permit};
use super::placement::Placement;
use super::roots::CaMaterial;
use crate::auth::{AuthError, Authenticator, Caller};
use slipstream_api::ca::istio_certificate_service_server::{IstioCertificateService, IstioCertificateServiceServer};
use slipstream_api::ca::{IstioCertificateRequest, IstioCertificateResponse};
use slipstream_api::IMPERSONATED_IDENTITY;
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::{Csr, CsrError, DEFAULT_WORKLOAD_VALIDITY};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Code, Status};

/// How the certificate service behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct CaConfig {
    /// The mesh's trust domain: no other is signed.
    pub trust_domain: TrustDomain,
    /// The lifetime of a certificate whose request names none.
    pub default_validity: Duration,
    /// The longest lifetime issued; longer requests are cut to it (Istio
    /// refuses them; a ztunnel asking for more than we allow would then
    /// get nothing at all).
    pub max_validity: Duration,
    pub limits: CallerLimits,
}

impl Default for CaConfig {
    fn default() -> Self {
        CaConfig {
            trust_domain: TrustDomain::default(),
            default_validity: DEFAULT_WORKLOAD_VALIDITY,
            max_validity: DEFAULT_WORKLOAD_VALIDITY,
            limits: CallerLimits::default(),
        }
    }
}

/// Why a certificate was not issued. The message is what the caller reads
/// (never a credential); the code is the gRPC status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Auth(AuthError),
    #[error("{0}")]
    Limited(Limited),
    #[error("invalid CSR: {0}")]
    Csr(CsrError),
    #[error("ImpersonatedIdentity {value:?} is not a SPIFFE workload identity: {reason}")]
    BadImpersonation { value: String, reason: String },
    #[error("ImpersonatedIdentity {impersonated} differs from the identity the CSR asks for, {csr}")]
    ImpersonationMismatch { impersonated: SpiffeId, csr: SpiffeId },
    #[error("{identity} is not in the mesh's trust domain {trust_domain}")]
    TrustDomain { identity: SpiffeId, trust_domain: TrustDomain },
    #[error("no pod on {node} runs as {identity}")]
    NotOnNode { node: String, identity: SpiffeId },
    #[error("{caller} may obtain only its own identity, not {identity}")]
    NotOwnIdentity { caller: String, identity: SpiffeId },
    #[error("signing failed: {0}")]
    Signing(String),
}

impl Refusal {
    pub fn code(&self) -> Code {
        match self {
            Refusal::Auth(AuthError::Unavailable(_)) => Code::Unavailable,
            Refusal::Auth(_) => Code::Unauthenticated,
            Refusal::Limited(_) => Code::ResourceExhausted,
            Refusal::Csr(_) | Refusal::BadImpersonation { .. } | Refusal::ImpersonationMismatch { .. } | Refusal::TrustDomain { .. } => {
                Code::InvalidArgument
            }
            Refusal::NotOnNode { .. } | Refusal::NotOwnIdentity { .. } => Code::PermissionDenied,
            Refusal::Signing(_) => Code::Internal,
        }
    }

    /// A short word for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Auth(_) => "unauthenticated",
            Refusal::Limited(_) => "rate_limited",
            Refusal::Csr(_) => "invalid_csr",
            Refusal::BadImpersonation { .. } | Refusal::ImpersonationMismatch { .. } => "invalid_impersonation",
            Refusal::TrustDomain { .. } => "foreign_trust_domain",
            Refusal::NotOnNode { .. } => "not_on_node",
            Refusal::NotOwnIdentity { .. } => "not_own_identity",
            Refusal::Signing(_) => "signing_failed",
        }
    }

    pub fn status(&self) -> Status {
        Status::new(self.code(), self.to_string())
    }
}

/// What `ImpersonatedIdentity` says: absent (or empty, as Istio reads it),
/// or a value that must be a SPIFFE ID.
pub fn impersonated(req: &IstioCertificateRequest) -> Result<Option<SpiffeId>, Refusal> {
    let Some(v) = req.metadata.as_ref().and_then(|m| m.fields.get(IMPERSONATED_IDENTITY)) else { return Ok(None) };
    let Some(s) = slipstream_api::struct_string(req.metadata.as_ref(), IMPERSONATED_IDENTITY) else {
        return Err(Refusal::BadImpersonation { value: format!("{:?}", v.kind), reason: "not a string".into() });
    };
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e: slipstream_core::SpiffeIdError| Refusal::BadImpersonation { value: s.to_string(), reason: e.to_string() })
}

/// The decision: which identity `caller` gets for a CSR that asks for
/// `asked`, with `impersonated` from the request's metadata.
pub fn decide(
    caller: &Caller,
    asked: &SpiffeId,
    impersonated: Option<&SpiffeId>,
    trust_domain: &TrustDomain,
    placement: &dyn Placement,
) -> Result<SpiffeId, Refusal> {
    if let Some(imp) = impersonated {
        if imp != asked {
            return Err(Refusal::ImpersonationMismatch { impersonated: imp.clone(), csr: asked.clone() });
        }
    }
    if asked.trust_domain() != trust_domain {
        return Err(Refusal::TrustDomain { identity: asked.clone(), trust_domain: trust_domain.clone() });
    }
    // A workload calling for itself gets exactly its own identity.
    if let Some(own) = &caller.identity {
        if *own != asked.to_string() {
            return Err(Refusal::NotOwnIdentity { caller: caller.subject.clone(), identity: asked.clone() });
        }
        return Ok(asked.clone());
    }
    if !placement.runs_on(&caller.node, &asked.to_string()) {
        return Err(Refusal::NotOnNode { node: caller.node.clone(), identity: asked.clone() });
    }
    Ok(asked.clone())
}

/// The lifetime to issue: the request's (seconds; zero or less means "the
/// default"), never more than the maximum.
pub fn validity(requested_secs: i64, config: &CaConfig) -> Duration {
    let asked = if requested_secs <= 0 { config.default_validity } else { Duration::from_secs(requested_secs as u64) };
    asked.min(config.max_validity)
}

/// The certificate service. Clones share everything.
#[derive(Clone)]
pub struct CaService {
    inner: Arc<Inner>,
}

struct Inner {
    config: CaConfig,
    auth: Arc<dyn Authenticator>,
    placement: Arc<dyn Placement>,
    material: CaMaterial,
    limits: Limits,
}

/// What is known of a request as it goes, for its log line.
#[derive(Default)]
struct Seen {
    caller: Option<Caller>,
    peer: Option<SocketAddr>,
    identity: Option<String>,
}

impl Seen {
    /// Whose budget a refusal line comes out of: the caller once known,
    /// else the peer's address.
    fn log_key(&self) -> String {
        match (&self.caller, self.peer) {
            (Some(c), _) => c.budget(),
            (None, Some(p)) => format!("peer:{}", p.ip()),
            (None, None) => "unauthenticated".into(),
        }
    }
}

impl CaService {
    pub fn new(config: CaConfig, auth: Arc<dyn Authenticator>, placement: Arc<dyn Placement>, material: CaMaterial) -> CaService {
        let limits = Limits::new(config.limits.clone());
        CaService { inner: Arc::new(Inner { config, auth, placement, material, limits }) }
    }

    /// The tonic service, to mount next to xDS on the control plane's port.
    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self)
    }

    pub fn material(&self) -> &CaMaterial {
        &self.inner.material
    }

    /// One request, start to end: the chain (leaf, intermediates, root
    /// bundle last), or the refusal, logged.
    pub async fn create(
        &self,
        md: &tonic::metadata::MetadataMap,
        peer: Option<SocketAddr>,
        req: &IstioCertificateRequest,
    ) -> Result<Vec<String>, Refusal> {
        let mut seen = Seen { peer, ..Default::default() };
        let r = self.issue(md, req, &mut seen).await;
        match &r {
            Ok(chain) => self.log_issued(&seen, chain, req),
            Err(refusal) => self.log_refused(&seen, refusal),
        }
        r
    }

    async fn issue(
        &self,
        md: &tonic::metadata::MetadataMap,
        req: &IstioCertificateRequest,
        seen: &mut Seen,
    ) -> Result<Vec<String>, Refusal> {
        let inner = &self.inner;
        // What the caller says it wants, for the log, before anything is
        // checked (a refused caller's ask is what an operator looks for).
        seen.identity = slipstream_api::struct_string(req.metadata.as_ref(), IMPERSONATED_IDENTITY).map(str::to_string);
        // Bounded and remembered for refusals by the auth::Gate in front.
        let caller = inner.auth.authenticate(md).await.map_err(Refusal::Auth)?;
        seen.caller = Some(caller.clone());
        let _permit: Permit = inner.limits.admit(&caller.budget(), Instant::now()).map_err(Refusal::Limited)?;
        let csr = Csr::parse(&req.csr).map_err(Refusal::Csr)?;
        if seen.identity.is_none() {
            seen.identity = Some(csr.identity().to_string());
        }
        let imp = impersonated(req)?;
        decide(&caller, csr.identity(), imp.as_ref(), &inner.config.trust_domain, inner.placement.as_ref())?;
        let ca = inner.material.current();
        ca.sign_request(&csr, validity(req.validity_duration, &inner.config)).map_err(|e| Refusal::Signing(e.to_string()))
    }

    fn log_issued(&self, seen: &Seen, chain: &[String], req: &IstioCertificateRequest) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let leaf = rustls_pemfile::certs(&mut chain[0].as_bytes()).next().and_then(Result::ok);
        let (serial, not_after) = leaf
            .as_ref()
            .and_then(|der| {
                use x509_parser::prelude::FromDer;
                x509_parser::certificate::X509Certificate::from_der(der.as_ref()).ok().map(|(_, c)| {
                    (
                        c.raw_serial_as_string(),
                        slipstream_identity::format_time(
                            std::time::UNIX_EPOCH + Duration::from_secs(c.validity().not_after.timestamp().max(0) as u64),
                        ),
                    )
                })
            })
            .unwrap_or_default();
        let caller = seen.caller.as_ref();
        tracing::debug!(
            caller = caller.map(|c| c.subject.as_str()).unwrap_or("-"),
            node = caller.map(|c| c.node.as_str()).unwrap_or("-"),
            identity = seen.identity.as_deref().unwrap_or("-"),
            serial,
            not_after,
            requested_validity_s = req.validity_duration,
            "certificate issued"
        );
    }

    fn log_refused(&self, seen: &Seen, refusal: &Refusal) {
        let suppressed = match self.inner.limits.log_refusal(&seen.log_key(), Instant::now()) {
            LogDecision::Suppress => return,
            LogDecision::Write { suppressed } => suppressed,
        };
        let caller = seen.caller.as_ref();
        tracing::warn!(
            caller = caller.map(|c| c.subject.as_str()).unwrap_or("-"),
            node = caller.map(|c| c.node.as_str()).unwrap_or("-"),
            peer = seen.peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            identity = seen.identity.as_deref().unwrap_or("-"),
            reason = refusal.reason(),
            suppressed_since_last = suppressed,
            "certificate refused: {refusal}"
        );
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, Status> {
        let peer = crate::peer::peer_of(&request);
        let r = self.create(request.metadata(), peer, request.get_ref()).await;
        if !matches!(r, Err(Refusal::Auth(_))) {
            crate::peer::authenticated(&request);
        }
        match r {
            Ok(cert_chain) => Ok(tonic::Response::new(IstioCertificateResponse { cert_chain })),
            Err(refusal) => Err(refusal.status()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OnNode1;
    impl Placement for OnNode1 {
        fn runs_on(&self, node: &str, identity: &str) -> bool {
            node == "node1" && identity == "spiffe://cluster.local/ns/default/sa/web"
        }
    }

    fn id(s: &str) -> SpiffeId {
        s.parse().unwrap()
    }

    #[test]
    fn decisions() {
        let node1 = Caller { node: "node1".into(), subject: "node-token:node1".into(), identity: None };
        let node2 = Caller { node: "node2".into(), subject: "node-token:node2".into(), identity: None };
        // A waypoint on node2 (where `web` does not run), calling for itself.
        let waypoint = Caller {
            node: "node2".into(),
            subject: "workload-token:default/waypoint-abc".into(),
            identity: Some("spiffe://cluster.local/ns/default/sa/waypoint".into()),
        };
        let own = id("spiffe://cluster.local/ns/default/sa/waypoint");
        let web = id("spiffe://cluster.local/ns/default/sa/web");
        let admin = id("spiffe://cluster.local/ns/default/sa/admin");
        let foreign = id("spiffe://other.org/ns/default/sa/web");
        let td = TrustDomain::default();
        type Case<'a> = (&'a Caller, &'a SpiffeId, Option<&'a SpiffeId>, Result<SpiffeId, (Code, &'a str)>);
        let cases: Vec<Case> = vec![
            (&waypoint, &own, None, Ok(own.clone())),
            (&waypoint, &own, Some(&own), Ok(own.clone())),
            (
                &waypoint,
                &web,
                None,
                Err((
                    Code::PermissionDenied,
                    "workload-token:default/waypoint-abc may obtain only its own identity, not spiffe://cluster.local/ns/default/sa/web",
                )),
            ),
            (&node1, &web, None, Ok(web.clone())),
            (&node1, &web, Some(&web), Ok(web.clone())),
            (&node2, &web, Some(&web), Err((Code::PermissionDenied, "no pod on node2 runs as spiffe://cluster.local/ns/default/sa/web"))),
            (&node1, &admin, None, Err((Code::PermissionDenied, "no pod on node1 runs as spiffe://cluster.local/ns/default/sa/admin"))),
            (
                &node1,
                &web,
                Some(&admin),
                Err((
                    Code::InvalidArgument,
                    "ImpersonatedIdentity spiffe://cluster.local/ns/default/sa/admin differs from the identity the CSR asks for, spiffe://cluster.local/ns/default/sa/web",
                )),
            ),
            (
                &node1,
                &foreign,
                None,
                Err((Code::InvalidArgument, "spiffe://other.org/ns/default/sa/web is not in the mesh's trust domain cluster.local")),
            ),
        ];
        for (caller, asked, imp, want) in cases {
            let got = decide(caller, asked, imp, &td, &OnNode1).map_err(|r| (r.code(), r.to_string()));
            let want = want.map_err(|(c, m)| (c, m.to_string()));
            assert_eq!(got, want, "{} asks for {asked} (impersonating {imp:?})", caller.node);
        }
    }

    #[test]
    fn validity_is_clamped() {
        let c = CaConfig { default_validity: Duration::from_secs(3600), max_validity: Duration::from_secs(7200), ..Default::default() };
        assert_eq!(validity(0, &c), Duration::from_secs(3600));
        assert_eq!(validity(-5, &c), Duration::from_secs(3600));
        assert_eq!(validity(60, &c), Duration::from_secs(60));
        assert_eq!(validity(86_400 * 365, &c), Duration::from_secs(7200));
    }

    #[test]
    fn impersonation_metadata() {
        let req = |v: Option<prost_types::value::Kind>| IstioCertificateRequest {
            metadata: v.map(|k| prost_types::Struct {
                fields: [(IMPERSONATED_IDENTITY.to_string(), prost_types::Value { kind: Some(k) })].into(),
            }),
            ..Default::default()
        };
        use prost_types::value::Kind;
        assert_eq!(impersonated(&req(None)), Ok(None));
        assert_eq!(impersonated(&req(Some(Kind::StringValue(String::new())))), Ok(None));
        assert_eq!(
            impersonated(&req(Some(Kind::StringValue("spiffe://cluster.local/ns/a/sa/b".into())))),
            Ok(Some(id("spiffe://cluster.local/ns/a/sa/b")))
        );
        let bad = impersonated(&req(Some(Kind::StringValue("web".into())))).unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
        assert!(bad.to_string().starts_with("ImpersonatedIdentity \"web\" is not a SPIFFE workload identity"), "{bad}");
        assert_eq!(impersonated(&req(Some(Kind::NumberValue(1.0)))).unwrap_err().reason(), "invalid_impersonation");
    }
}
