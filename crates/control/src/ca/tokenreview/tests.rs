use super::*;
use k8s_openapi::api::authentication::v1::UserInfo;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn status(authenticated: bool, user: &str, node: Option<&str>, audiences: &[&str]) -> TokenReviewStatus {
    let mut extra = BTreeMap::new();
    if let Some(n) = node {
        extra.insert(NODE_NAME_EXTRA.to_string(), vec![n.to_string()]);
        extra.insert("authentication.kubernetes.io/pod-name".to_string(), vec!["ztunnel-abcde".to_string()]);
    }
    TokenReviewStatus {
        authenticated: Some(authenticated),
        audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
        user: Some(UserInfo { username: Some(user.into()), extra: Some(extra), ..Default::default() }),
        error: None,
    }
}

#[test]
fn review_answers() {
    let p = ReviewPolicy::default();
    let zt = "system:serviceaccount:istio-system:ztunnel";
    let no_waypoint = |_: &str, _: &str, _: &str| false;
    let ok = caller_from_review(&status(true, zt, Some("node1"), &["istio-ca"]), &p, &no_waypoint).unwrap();
    assert_eq!(ok, Caller { node: "node1".into(), subject: zt.into(), identity: None });

    let refused = |s: TokenReviewStatus| caller_from_review(&s, &p, &no_waypoint).unwrap_err().to_string();
    assert_eq!(refused(status(false, "", None, &[])), "the token was refused: TokenReview: the token is not valid");
    let mut expired = status(false, "", None, &[]);
    expired.error = Some("token has expired".into());
    assert_eq!(refused(expired), "the token was refused: TokenReview: token has expired");
    assert_eq!(
        refused(status(true, "system:serviceaccount:default:sleep", Some("node1"), &["istio-ca"])),
        "the token was refused: service account default/sleep is neither a node proxy's (allowed: istio-system/ztunnel) \
         nor the token of a waypoint's pod (a pod of Gateway default/sleep of class istio-waypoint)"
    );
    assert_eq!(refused(status(true, "alice", Some("node1"), &["istio-ca"])), "the token was refused: \"alice\" is not a service account");
    assert!(
        refused(status(true, zt, None, &["istio-ca"])).contains("is not bound to a pod (authentication.kubernetes.io/node-name is absent)")
    );
    assert_eq!(refused(status(true, zt, Some("node1"), &["kubernetes"])), "the token was refused: the token is not for audience istio-ca");
    // With no audience required, the API server's default audience does.
    let any = ReviewPolicy { audiences: vec![], ..Default::default() };
    assert!(caller_from_review(&status(true, zt, Some("node1"), &[]), &any, &no_waypoint).is_ok());
}

#[test]
fn a_waypoints_pod_gets_exactly_its_own_identity() {
    let p = ReviewPolicy { trust_domain: "corp.example".into(), ..Default::default() };
    let is_waypoint = |ns: &str, pod: &str, sa: &str| (ns, pod, sa) == ("shop", "ztunnel-abcde", "waypoint");
    let wp = "system:serviceaccount:shop:waypoint";
    let ok = caller_from_review(&status(true, wp, Some("node2"), &["istio-ca"]), &p, &is_waypoint).unwrap();
    let subject = format!("{wp} (pod shop/ztunnel-abcde)");
    assert_eq!(ok, Caller { node: "node2".into(), subject, identity: Some("spiffe://corp.example/ns/shop/sa/waypoint".into()) });
    assert_eq!(ok.budget(), "workload:system:serviceaccount:shop:waypoint (pod shop/ztunnel-abcde)", "its own share of the CA's bounds");
    // The same account in another namespace is not a waypoint's.
    let other = caller_from_review(&status(true, "system:serviceaccount:default:waypoint", Some("node2"), &["istio-ca"]), &p, &is_waypoint);
    assert!(other.unwrap_err().to_string().contains("nor the token of a waypoint's pod"));
    // A token bound to no pod (so to no waypoint pod) is refused.
    let unbound = caller_from_review(&status(true, wp, None, &["istio-ca"]), &p, &is_waypoint);
    assert!(unbound.unwrap_err().to_string().contains("nor the token of a waypoint's pod"));
    // Another pod of the same account (one that merely shares the name).
    let elsewhere = |ns: &str, pod: &str, sa: &str| (ns, pod, sa) == ("shop", "waypoint-7d9f", "waypoint");
    assert!(caller_from_review(&status(true, wp, Some("node2"), &["istio-ca"]), &p, &elsewhere).is_err());
}

#[test]
fn service_account_flags() {
    assert_eq!(
        ReviewPolicy::parse_accounts(&["istio-system/ztunnel".into(), "kube-system/slipstream-node".into()]).unwrap(),
        vec![("istio-system".into(), "ztunnel".into()), ("kube-system".into(), "slipstream-node".into())]
    );
    for bad in ["ztunnel", "/ztunnel", "ns/", "a/b/c"] {
        assert!(ReviewPolicy::parse_accounts(&[bad.into()]).is_err(), "{bad}");
    }
}

/// A stand-in API server: answers every TokenReview with `answer`, after
/// checking what was asked; counts the calls.
fn fake_apiserver(answer: TokenReviewStatus, calls: Arc<AtomicUsize>) -> kube::Client {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let answer = answer.clone();
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
            use http_body_util::BodyExt;
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let asked: TokenReview = serde_json::from_slice(&body).unwrap();
            assert_eq!(asked.spec.token.as_deref(), Some("the-token"));
            assert_eq!(asked.spec.audiences, Some(vec!["istio-ca".to_string()]));
            let mut reply = asked;
            reply.spec.token = None;
            reply.status = Some(answer);
            let bytes = serde_json::to_vec(&reply).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(bytes))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(svc, "default")
}

fn md(token: &str) -> tonic::metadata::MetadataMap {
    let mut m = tonic::metadata::MetadataMap::new();
    m.insert("authorization", format!("Bearer {token}").parse().unwrap());
    m
}

#[tokio::test]
async fn tokens_are_reviewed_once_then_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let zt = "system:serviceaccount:istio-system:ztunnel";
    let a = TokenReviewAuthenticator::new(
        fake_apiserver(status(true, zt, Some("node7"), &["istio-ca"]), calls.clone()),
        ReviewPolicy::default(),
    );
    for _ in 0..3 {
        let c = a.authenticate(&md("the-token")).await.unwrap();
        assert_eq!(c.node, "node7");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "positive answers are cached");
    assert_eq!(a.authenticate(&tonic::metadata::MetadataMap::new()).await, Err(AuthError::Missing));
    assert!(!format!("{a:?}").contains("the-token"));
}

#[tokio::test]
async fn refusals_are_not_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let a = TokenReviewAuthenticator::new(fake_apiserver(status(false, "", None, &[]), calls.clone()), ReviewPolicy::default());
    for _ in 0..2 {
        assert!(matches!(a.authenticate(&md("the-token")).await, Err(AuthError::Rejected(_))));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unreachable_api_server_is_unavailable_not_unauthenticated() {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("connection refused"))
    });
    let a = TokenReviewAuthenticator::new(kube::Client::new(svc, "default"), ReviewPolicy::default());
    let e = a.authenticate(&md("the-token")).await.unwrap_err();
    assert!(matches!(e, AuthError::Unavailable(_)), "{e:?}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
}
