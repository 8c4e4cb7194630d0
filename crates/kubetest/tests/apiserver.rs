//! The test server is a real Kubernetes API: objects round-trip through etcd,
//! and service-account tokens bound to pods authenticate with their node.
//! Without etcd or kube-apiserver these tests fail with a message naming
//! what is missing; they never skip.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec, TokenReviewStatus,
};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use slipstream_kubetest::{KubeTestServer, API_AUDIENCE};

const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const NODE_UID: &str = "authentication.kubernetes.io/node-uid";
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), ..Default::default() }
}

fn pod(name: &str, node: &str, service_account: &str) -> Pod {
    Pod {
        metadata: ObjectMeta { labels: Some(BTreeMap::from([("app".into(), "web".into())])), ..meta(name) },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            service_account_name: Some(service_account.into()),
            containers: vec![Container { name: "app".into(), image: Some("example.invalid/app:1".into()), ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &Namespace { metadata: meta(name), ..Default::default() }).await?;
    Ok(())
}

async fn review(client: &kube::Client, token: &str) -> anyhow::Result<TokenReviewStatus> {
    let review = TokenReview { spec: TokenReviewSpec { token: Some(token.into()), audiences: None }, ..Default::default() };
    let answer = Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.unwrap_or_default())
}

async fn pod_bound_token(client: &kube::Client, ns: &str, service_account: &str, pod: &Pod) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![API_AUDIENCE.into()],
            expiration_seconds: Some(600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await?;
    Ok(answer.status.expect("a TokenRequest answer has a status").token)
}

fn extra(status: &TokenReviewStatus, key: &str) -> Option<Vec<String>> {
    status.user.as_ref()?.extra.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn namespaces_and_pods_round_trip_through_etcd() -> anyhow::Result<()> {
    let server = KubeTestServer::start().await?;
    let client = server.client().await?;

    create_namespace(&client, "shop").await?;
    let ns = Api::<Namespace>::all(client.clone()).get("shop").await?;
    assert!(ns.metadata.uid.is_some(), "the API server assigns a uid: {ns:?}");

    let pods = Api::<Pod>::namespaced(client.clone(), "shop");
    pods.create(&PostParams::default(), &pod("web-1", "node-a", "web")).await?;
    let read = pods.get("web-1").await?;
    assert_eq!(read.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("node-a"));
    assert_eq!(read.spec.as_ref().and_then(|s| s.service_account_name.as_deref()), Some("web"));
    let listed = pods.list(&ListParams::default().labels("app=web")).await?;
    assert_eq!(listed.items.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>(), ["web-1"]);

    // The admission chain runs: a pod in a namespace that does not exist is refused.
    let refused = Api::<Pod>::namespaced(client.clone(), "absent").create(&PostParams::default(), &pod("x", "node-a", "web")).await;
    assert!(matches!(&refused, Err(kube::Error::Api(e)) if e.code == 404), "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn pod_bound_tokens_authenticate_with_their_node() -> anyhow::Result<()> {
    let server = KubeTestServer::start().await?;
    let client = server.client().await?;
    create_namespace(&client, "mesh").await?;
    Api::<ServiceAccount>::namespaced(client.clone(), "mesh")
        .create(&PostParams::default(), &ServiceAccount { metadata: meta("app"), ..Default::default() })
        .await?;
    let node =
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &Node { metadata: meta("node-a"), ..Default::default() }).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "mesh");
    let on_a = pods.create(&PostParams::default(), &pod("app-1", "node-a", "app")).await?;
    // No Node object named node-b: the token still carries the node's name.
    let on_b = pods.create(&PostParams::default(), &pod("app-2", "node-b", "app")).await?;

    let token = pod_bound_token(&client, "mesh", "app", &on_a).await?;
    let status = review(&client, &token).await?;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.as_ref().expect("an authenticated review names the user");
    assert_eq!(user.username.as_deref(), Some("system:serviceaccount:mesh:app"));
    assert_eq!(status.audiences.as_deref(), Some(&[API_AUDIENCE.to_string()][..]));
    assert_eq!(extra(&status, POD_NAME), Some(vec!["app-1".into()]));
    assert_eq!(extra(&status, NODE_NAME), Some(vec!["node-a".into()]));
    assert_eq!(extra(&status, NODE_UID), Some(vec![node.metadata.uid.clone().expect("a stored node has a uid")]));

    let status = review(&client, &pod_bound_token(&client, "mesh", "app", &on_b).await?).await?;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(extra(&status, NODE_NAME), Some(vec!["node-b".into()]));
    assert_eq!(extra(&status, NODE_UID), None, "{status:?}");

    // The binding is checked at every review: once the pod is gone, so is
    // its token. kube-apiserver caches a successful authentication for 10s
    // per token, and looks the pod up in its informer cache first, so the
    // deletion takes effect when that cache hears of it: moments later. A
    // token reviewed while the cache still had the pod would then pass for
    // 10s more, so each review below uses a token never reviewed before.
    let mut unreviewed = Vec::new();
    for _ in 0..60 {
        unreviewed.push(pod_bound_token(&client, "mesh", "app", &on_a).await?);
    }
    pods.delete("app-1", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    let mut last = None;
    for token in &unreviewed {
        let status = review(&client, token).await?;
        if status.authenticated != Some(true) {
            last = None;
            break;
        }
        last = Some(status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.is_none(), "the tokens of a deleted pod still authenticate after 6s: {last:?}");

    for bogus in ["not-a-token", "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"] {
        let status = review(&client, bogus).await?;
        assert_ne!(status.authenticated, Some(true), "{bogus}: {status:?}");
        assert_eq!(status.user.and_then(|u| u.username), None, "{bogus}");
    }
    Ok(())
}
