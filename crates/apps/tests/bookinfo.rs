//! The bookinfo call graph in-process on loopback: every role as its own
//! server, wired with address overrides the way the CLI flags do it.

mod common;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{closed_port, get, http1, http2, loopback_listener};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use slipstream_apps::{serve_bookinfo, BookinfoConfig, Role, Upstreams};

fn upstreams(details: SocketAddr, reviews: SocketAddr, ratings: SocketAddr) -> Upstreams {
    let a = |addr: SocketAddr| addr.to_string().parse().unwrap();
    Upstreams { details: a(details), reviews: a(reviews), ratings: a(ratings) }
}

async fn start(role: Role, version: &str, upstreams: Upstreams) -> SocketAddr {
    let config = BookinfoConfig::new(role, version, upstreams).expect("valid config");
    let (listener, addr) = loopback_listener().await;
    tokio::spawn(serve_bookinfo(listener, config));
    addr
}

/// A leaf service with no upstreams.
async fn start_leaf(role: Role) -> SocketAddr {
    let nowhere = closed_port();
    start(role, "v1", upstreams(nowhere, nowhere, nowhere)).await
}

/// ratings v1, details v1, reviews `<reviews_version>` (calling `ratings`)
/// and a productpage in front; returns productpage's and reviews' addresses.
async fn start_graph(reviews_version: &str, ratings: SocketAddr) -> (SocketAddr, SocketAddr) {
    let nowhere = closed_port();
    let details = start_leaf(Role::Details).await;
    let reviews = start(Role::Reviews, reviews_version, upstreams(nowhere, nowhere, ratings)).await;
    let productpage = start(Role::Productpage, "v1", upstreams(details, reviews, nowhere)).await;
    (productpage, reviews)
}

fn stars(reviews: &Value) -> Vec<Value> {
    reviews["reviews"].as_array().expect("reviews array").iter().map(|r| r.get("rating").cloned().unwrap_or(Value::Null)).collect()
}

#[tokio::test]
async fn productpage_with_reviews_v2_shows_ratings_in_black() {
    let ratings = start_leaf(Role::Ratings).await;
    let (productpage, _) = start_graph("v2", ratings).await;

    let answer = http1(productpage, get("/api/v1/products/0")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("x-served-by"), "productpage-v1");
    let doc = answer.json();
    assert_eq!(doc["served_by"], "productpage-v1");
    assert_eq!(doc["details"]["served_by"], "details-v1");
    assert_eq!(doc["details"]["author"], "William Shakespeare");
    assert_eq!(doc["details"]["year"], 1595);
    assert_eq!(doc["reviews"]["served_by"], "reviews-v2");
    assert_eq!(doc["reviews"]["ratings_served_by"], "ratings-v1");
    assert_eq!(stars(&doc["reviews"]), [json!({"stars": 5, "color": "black"}), json!({"stars": 4, "color": "black"})]);
    assert!(doc.get("details_error").is_none() && doc.get("reviews_error").is_none());

    let page = http1(productpage, get("/productpage")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.header("content-type").starts_with("text/html"));
    let html = page.text();
    assert!(html.contains("productpage-v1 details-v1 reviews-v2 ratings-v1"), "{html}");
    assert!(html.contains("color: black") && html.contains("William Shakespeare"), "{html}");
}

#[tokio::test]
async fn reviews_v3_shows_red_stars() {
    let ratings = start_leaf(Role::Ratings).await;
    let (productpage, _) = start_graph("v3", ratings).await;
    let doc = http2(productpage, get("/api/v1/products/0")).await.json();
    assert_eq!(doc["reviews"]["served_by"], "reviews-v3");
    assert_eq!(stars(&doc["reviews"]), [json!({"stars": 5, "color": "red"}), json!({"stars": 4, "color": "red"})]);
    let html = http1(productpage, get("/productpage")).await.text();
    assert!(html.contains("productpage-v1 details-v1 reviews-v3 ratings-v1") && html.contains("color: red"), "{html}");
}

#[tokio::test]
async fn reviews_v1_never_calls_ratings() {
    // ratings points at a capturing server: v1 must not call it.
    let (capture, seen) = start_capture(Duration::ZERO).await;
    let (productpage, _) = start_graph("v1", capture).await;
    let doc = http1(productpage, get("/api/v1/products/0")).await.json();
    assert_eq!(doc["reviews"]["served_by"], "reviews-v1");
    assert_eq!(stars(&doc["reviews"]), [Value::Null, Value::Null]);
    assert!(doc["reviews"].get("ratings_error").is_none());
    let html = http1(productpage, get("/productpage")).await.text();
    assert!(html.contains(">productpage-v1 details-v1 reviews-v1</span>"), "{html}");
    assert!(!html.contains("class=\"stars\""));
    assert!(seen.locked().is_empty(), "reviews-v1 called ratings");
}

#[tokio::test]
async fn ratings_down_degrades_reviews_but_still_answers_200() {
    let (productpage, reviews) = start_graph("v2", closed_port()).await;

    let answer = http1(reviews, get("/reviews/0")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("x-served-by"), "reviews-v2");
    let doc = answer.json();
    let reason = doc["ratings_error"].as_str().expect("ratings_error");
    assert!(reason.starts_with("ratings at 127.0.0.1:") && reason.to_lowercase().contains("refused"), "{reason}");
    assert_eq!(stars(&doc), [Value::Null, Value::Null]);

    let page = http1(productpage, get("/productpage")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text().contains("Ratings service is currently unavailable"));
}

#[tokio::test]
async fn slow_ratings_hits_the_3s_deadline() {
    let (slow, _) = start_capture(Duration::from_secs(10)).await;
    let nowhere = closed_port();
    let reviews = start(Role::Reviews, "v3", upstreams(nowhere, nowhere, slow)).await;
    let started = std::time::Instant::now();
    let doc = http1(reviews, get("/reviews/0")).await.json();
    let elapsed = started.elapsed();
    assert!(doc["ratings_error"].as_str().unwrap().contains("no answer within 3s"), "{doc}");
    assert!((Duration::from_millis(2900)..Duration::from_secs(6)).contains(&elapsed), "{elapsed:?}");
}

#[tokio::test]
async fn upstream_failures_degrade_productpage_but_still_answer_200() {
    let nowhere = closed_port();
    let productpage = start(Role::Productpage, "v1", upstreams(nowhere, nowhere, nowhere)).await;
    let answer = http1(productpage, get("/api/v1/products/0")).await;
    assert_eq!(answer.status, StatusCode::OK);
    let doc = answer.json();
    assert!(doc["details_error"].as_str().unwrap().starts_with("details at "), "{doc}");
    assert!(doc["reviews_error"].as_str().unwrap().starts_with("reviews at "), "{doc}");
    let html = http1(productpage, get("/productpage")).await.text();
    assert!(html.contains("product details are currently unavailable") && html.contains(">productpage-v1</span>"));
}

#[tokio::test]
async fn trace_and_user_headers_are_propagated_through_the_graph() {
    // The capturing server stands in for both details and ratings, so one
    // request checks productpage -> details and productpage -> reviews -> ratings.
    let (capture, seen) = start_capture(Duration::ZERO).await;
    let nowhere = closed_port();
    let reviews = start(Role::Reviews, "v2", upstreams(nowhere, nowhere, capture)).await;
    let productpage = start(Role::Productpage, "v1", upstreams(capture, reviews, nowhere)).await;

    let req = Request::get("/productpage")
        .header("end-user", "jason")
        .header("x-request-id", "req-42")
        .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .header("authorization", "Bearer not-for-upstreams")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(http1(productpage, req).await.status, StatusCode::OK);

    let seen = seen.locked().clone();
    let mut paths: Vec<&str> = seen.iter().map(|(path, _)| path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["/details/0", "/ratings/0"]);
    for (path, headers) in &seen {
        assert_eq!(headers.get("end-user").unwrap(), "jason", "{path}");
        assert_eq!(headers.get("x-request-id").unwrap(), "req-42", "{path}");
        assert!(headers.get("traceparent").is_some(), "{path}");
        assert!(headers.get("authorization").is_none(), "{path}: authorization must not leak upstream");
    }
}

#[tokio::test]
async fn every_role_answers_health_and_names_itself() {
    let nowhere = closed_port();
    for (role, version, name) in [
        (Role::Productpage, "v1", "productpage-v1"),
        (Role::Details, "v2", "details-v2"),
        (Role::Reviews, "v3", "reviews-v3"),
        (Role::Ratings, "v1", "ratings-v1"),
    ] {
        let addr = start(role, version, upstreams(nowhere, nowhere, nowhere)).await;
        let answer = http1(addr, get("/health")).await;
        assert_eq!(answer.status, StatusCode::OK, "{name}");
        assert_eq!(answer.header("x-served-by"), name);
        assert_eq!(answer.json(), json!({"status": "ok", "served_by": name}));
        let missing = http1(addr, get("/no/such/path")).await;
        assert_eq!((missing.status, missing.header("x-served-by")), (StatusCode::NOT_FOUND, name));
        assert_eq!(missing.json()["served_by"], name);
    }
}

#[tokio::test]
async fn leaf_documents_and_bad_ids() {
    let details = start_leaf(Role::Details).await;
    let doc = http1(details, get("/details/7")).await.json();
    assert_eq!(doc["id"], 7);
    assert_eq!(doc["ISBN-13"], "123-1234567890");
    assert_eq!(doc["publisher"], "PublisherA");
    let bad = http1(details, get("/details/seven")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"].as_str().unwrap().contains("seven"));

    let ratings = start_leaf(Role::Ratings).await;
    let doc = http1(ratings, get("/ratings/0")).await.json();
    assert_eq!(doc, json!({"id": 0, "ratings": {"Reviewer1": 5, "Reviewer2": 4}, "served_by": "ratings-v1"}));

    let nowhere = closed_port();
    let productpage = start(Role::Productpage, "v1", upstreams(nowhere, nowhere, nowhere)).await;
    let list = http1(productpage, get("/api/v1/products")).await.json();
    assert_eq!(list[0]["id"], 0);
    assert_eq!(list[0]["title"], "The Comedy of Errors");
    let post = Request::post("/productpage").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(http1(productpage, post).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// A stand-in upstream that records each request's path and headers, waits
/// `delay`, and answers a ratings-shaped document.
async fn start_capture(delay: Duration) -> (SocketAddr, Seen) {
    let (listener, addr) = loopback_listener().await;
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    record.locked().push((req.uri().path().to_owned(), req.headers().clone()));
                    async move {
                        // Not synchronization: the upstream is slow on
                        // purpose (the caller's timeout is under test).
                        tokio::time::sleep(delay).await;
                        let body = json!({"id": 0, "ratings": {"Reviewer1": 1, "Reviewer2": 2}, "served_by": "capture"});
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (addr, seen)
}
