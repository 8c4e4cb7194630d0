//! Kubernetes callers: the bearer token is a ServiceAccount token, checked
//! with a TokenReview (`authentication.k8s.io/v1`), as istiod does.
//!
//! The token must belong to one of the node proxies' service accounts
//! (default `istio-system/ztunnel`) and be bound to a pod: the API server
//! then says which node that pod runs on (user.extra
//! `authentication.kubernetes.io/node-name`, Kubernetes 1.30 and later),
//! and that node is what the caller may obtain identities for. A token
//! that is not bound to a pod is refused rather than trusted for every
//! node.
//!
//! The one other caller let in is a waypoint: a token bound to a pod of a
//! Gateway of class `istio-waypoint` (labelled with its name, running as
//! the account named after it) may obtain that account's own identity and
//! nothing else. Istio signs any workload's own identity; a sidecar-less
//! mesh has no other workload that needs one, so no other gets one (a
//! certificate of its own would let a pod around its node proxy).

use crate::auth::{bearer, AuthError, Authenticator, Caller};
use futures_util::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The user.extra key that names the node of the pod a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// Who may call, and for which audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewPolicy {
    /// `(namespace, service account)` of the node proxies.
    pub node_proxies: Vec<(String, String)>,
    /// The audiences the token must be for (empty: the API server's own).
    pub audiences: Vec<String>,
    /// How long a positive answer is reused.
    pub cache_for: Duration,
    /// Answers remembered at most.
    pub cache_entries: usize,
    /// The mesh's trust domain (a waypoint's identity is in it).
    pub trust_domain: String,
}

impl Default for ReviewPolicy {
    fn default() -> Self {
        ReviewPolicy {
            node_proxies: vec![("istio-system".into(), "ztunnel".into())],
            audiences: vec!["istio-ca".into()],
            cache_for: Duration::from_secs(60),
            cache_entries: 4096,
            trust_domain: slipstream_core::DEFAULT_TRUST_DOMAIN.into(),
        }
    }
}

impl ReviewPolicy {
    /// Parses `namespace/name` service accounts (the flag's form).
    pub fn parse_accounts(list: &[String]) -> Result<Vec<(String, String)>, String> {
        list.iter()
            .map(|s| match s.split_once('/') {
                Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => Ok((ns.to_string(), sa.to_string())),
                _ => Err(format!("{s:?} is not a service account as namespace/name")),
            })
            .collect()
    }
}

/// The user.extra key that names the pod a token is bound to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// The caller a TokenReview's answer describes, or why it is refused.
/// `is_waypoint(namespace, pod, account)` says whether the pod is a
/// waypoint's, running as that account.
pub fn caller_from_review(
    status: &TokenReviewStatus,
    policy: &ReviewPolicy,
    is_waypoint: &dyn Fn(&str, &str, &str) -> bool,
) -> Result<Caller, AuthError> {
    if status.authenticated != Some(true) {
        let why = status.error.as_deref().filter(|e| !e.is_empty()).unwrap_or("the token is not valid");
        return Err(AuthError::Rejected(format!("TokenReview: {why}")));
    }
    if !policy.audiences.is_empty() {
        let got = status.audiences.as_deref().unwrap_or_default();
        if !got.iter().any(|a| policy.audiences.contains(a)) {
            return Err(AuthError::Rejected(format!("the token is not for audience {}", policy.audiences.join(" or "))));
        }
    }
    let user = status.user.as_ref().ok_or_else(|| AuthError::Rejected("TokenReview names no user".into()))?;
    let username = user.username.as_deref().unwrap_or_default();
    let (ns, sa) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .ok_or_else(|| AuthError::Rejected(format!("{username:?} is not a service account")))?;
    let extra = |key: &str| user.extra.as_ref().and_then(|e| e.get(key)).and_then(|v| v.first()).filter(|v| !v.is_empty());
    let node_proxy = policy.node_proxies.iter().any(|(n, s)| n == ns && s == sa);
    if !node_proxy && !extra(POD_NAME_EXTRA).is_some_and(|pod| is_waypoint(ns, pod, sa)) {
        let allowed: Vec<String> = policy.node_proxies.iter().map(|(n, s)| format!("{n}/{s}")).collect();
        return Err(AuthError::Rejected(format!(
            "service account {ns}/{sa} is neither a node proxy's (allowed: {}) nor the token of a waypoint's pod \
             (a pod of Gateway {ns}/{sa} of class istio-waypoint)",
            allowed.join(", ")
        )));
    }
    let node = extra(NODE_NAME_EXTRA).ok_or_else(|| {
            AuthError::Rejected(format!(
                "the token of {ns}/{sa} is not bound to a pod ({NODE_NAME_EXTRA} is absent): use a projected, pod-bound token (Kubernetes 1.30 or later)"
            ))
        })?;
    let identity = (!node_proxy).then(|| format!("spiffe://{}/ns/{ns}/sa/{sa}", policy.trust_domain));
    // A waypoint is one pod (its own share of the CA's bounds); the node
    // proxies of all nodes share one account, told apart by their node.
    let subject = match (&identity, extra(POD_NAME_EXTRA)) {
        (Some(_), Some(pod)) => format!("{username} (pod {ns}/{pod})"),
        _ => username.to_string(),
    };
    Ok(Caller { node: node.clone(), subject, identity })
}

/// The waypoints' pods, `(namespace, pod, service account)`, as the
/// index last published them (`Index::waypoint_pods`).
pub type WaypointPods = tokio::sync::watch::Receiver<std::collections::BTreeSet<(String, String, String)>>;

/// Asks the API server, through a kube client, who a token belongs to.
pub struct TokenReviewAuthenticator {
    client: kube::Client,
    policy: ReviewPolicy,
    cache: Mutex<HashMap<String, (Caller, Instant)>>,
    waypoints: Option<WaypointPods>,
}

impl TokenReviewAuthenticator {
    /// Node proxies only.
    pub fn new(client: kube::Client, policy: ReviewPolicy) -> Self {
        TokenReviewAuthenticator { client, policy, cache: Mutex::default(), waypoints: None }
    }

    /// Node proxies, and the waypoint pods `waypoints` names.
    pub fn with_waypoints(mut self, waypoints: WaypointPods) -> Self {
        self.waypoints = Some(waypoints);
        self
    }

    fn cached(&self, token: &str, now: Instant) -> Option<Caller> {
        let cache = self.cache.locked();
        cache.get(token).filter(|(_, until)| *until > now).map(|(c, _)| c.clone())
    }

    fn remember(&self, token: &str, caller: &Caller, now: Instant) {
        let mut cache = self.cache.locked();
        if cache.len() >= self.policy.cache_entries {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= self.policy.cache_entries {
                // Still full of live answers: start over rather than grow;
                // the cost is one more TokenReview per caller.
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (caller.clone(), now + self.policy.cache_for));
    }

    async fn review(&self, token: &str) -> Result<Caller, AuthError> {
        let now = Instant::now();
        if let Some(c) = self.cached(token, now) {
            return Ok(c);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.policy.audiences.is_empty()).then(|| self.policy.audiences.clone()),
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer = api.create(&kube::api::PostParams::default(), &review).await.map_err(|e| {
            AuthError::Unavailable(match &e {
                kube::Error::Api(s) if s.code == 403 => {
                    format!("TokenReview forbidden ({}): the control plane's service account needs `create` on tokenreviews (ClusterRole system:auth-delegator)", s.message)
                }
                _ => format!("TokenReview failed: {e}"),
            })
        })?;
        let is_waypoint = |ns: &str, pod: &str, sa: &str| {
            self.waypoints.as_ref().is_some_and(|w| w.borrow().contains(&(ns.to_string(), pod.to_string(), sa.to_string())))
        };
        let caller = caller_from_review(&answer.status.unwrap_or_default(), &self.policy, &is_waypoint)?;
        // Only node proxies' answers are reused: a waypoint calls rarely
        // (a certificate a day, a stream), and its next call is refused as
        // soon as its Gateway or pod is gone.
        if caller.identity.is_none() {
            self.remember(token, &caller, now);
        }
        Ok(caller)
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
        Box::pin(async move {
            let token = bearer(md)?;
            self.review(token).await
        })
    }
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the cached tokens.
        f.debug_struct("TokenReviewAuthenticator").field("policy", &self.policy).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
