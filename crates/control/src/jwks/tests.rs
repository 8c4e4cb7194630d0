//! Against a real HTTP server on loopback (allowed here by the setting
//! that is off by default, which the first test checks).

use super::*;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const JWKS_A: &str = r#"{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}"#;
const JWKS_B: &str = r#"{"keys":[{"kty":"EC","kid":"b","crv":"P-256","x":"AA","y":"AA"}]}"#;

/// Serves /jwks (the text in `current`), /oidc (naming /jwks), /redirect,
/// /big, /slow and /html; counts the requests.
async fn server(current: Arc<Mutex<&'static str>>, hits: Arc<Mutex<usize>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let current = current.clone();
            *hits.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body): (&str, String) = match path.as_str() {
                    "/jwks" => ("200 OK", current.lock().unwrap().to_string()),
                    "/oidc" => ("200 OK", format!(r#"{{"issuer":"http://{addr}","jwks_uri":"http://{addr}/jwks"}}"#)),
                    "/redirect" => ("302 Found", String::new()),
                    "/big" => ("200 OK", format!(r#"{{"keys":[],"pad":"{}"}}"#, "x".repeat(MAX_BODY))),
                    "/html" => ("200 OK", "<html>login</html>".to_string()),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        ("200 OK", JWKS_A.to_string())
                    }
                    _ => ("404 Not Found", String::new()),
                };
                let head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nlocation: /jwks\r\nconnection: close\r\n\r\n", body.len());
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    });
    addr
}

fn at(addr: SocketAddr, path: &str) -> Fetch {
    Fetch { url: format!("http://{addr}{path}"), discovery: false, timeout: Duration::from_secs(2) }
}

fn loopback() -> FetchSettings {
    FetchSettings { allow_loopback: true, refresh: Duration::from_millis(200), retry: Duration::from_millis(50) }
}

#[tokio::test]
async fn loopback_link_local_and_unspecified_are_never_fetched_by_default() {
    let hits = Arc::new(Mutex::new(0));
    let addr = server(Arc::new(Mutex::new(JWKS_A)), hits.clone()).await;
    let e = fetch(&at(addr, "/jwks"), &FetchSettings::default()).await.unwrap_err();
    assert!(matches!(e, FetchError::Refused { .. }), "{e}");
    assert_eq!(*hits.lock().unwrap(), 0, "refused before connecting");
    // Refused whatever the setting (no packet is sent to any of them).
    for url in ["http://169.254.169.254/latest/meta-data", "http://[::ffff:169.254.169.254]/x", "http://0.0.0.0/jwks", "http://[fe80::1]/x"]
    {
        let f = Fetch { url: url.into(), discovery: false, timeout: Duration::from_secs(1) };
        let e = fetch(&f, &loopback()).await.unwrap_err();
        assert!(matches!(e, FetchError::Refused { .. }), "{url}: {e}");
    }
    assert!(refused_address("::ffff:169.254.169.254".parse().unwrap(), true));
    assert!(refused_address("127.0.0.1".parse().unwrap(), false));
    assert!(!refused_address("10.96.0.10".parse().unwrap(), false), "cluster addresses are where issuers live");
}

#[tokio::test]
async fn a_jwks_by_uri_and_by_openid_discovery() {
    let addr = server(Arc::new(Mutex::new(JWKS_A)), Arc::new(Mutex::new(0))).await;
    assert_eq!(fetch(&at(addr, "/jwks"), &loopback()).await.unwrap(), JWKS_A);
    let oidc = Fetch { discovery: true, ..at(addr, "/oidc") };
    assert_eq!(fetch(&oidc, &loopback()).await.unwrap(), JWKS_A);
}

/// Whether an error is the one a case expects.
type Check = fn(&FetchError) -> bool;

#[tokio::test]
async fn what_is_not_a_key_set_is_refused_with_the_reason() {
    let addr = server(Arc::new(Mutex::new(JWKS_A)), Arc::new(Mutex::new(0))).await;
    let cases: [(&str, Check); 5] = [
        ("/redirect", |e| matches!(e, FetchError::Status { status: 302 }) && e.to_string().contains("redirects are not followed")),
        ("/big", |e| matches!(e, FetchError::TooLarge)),
        ("/html", |e| matches!(e, FetchError::NotJwks(_))),
        ("/missing", |e| matches!(e, FetchError::Status { status: 404 })),
        ("/oidc", |e| matches!(e, FetchError::NotJwks(_))),
    ];
    for (path, ok) in cases {
        let e = fetch(&at(addr, path), &loopback()).await.unwrap_err();
        assert!(ok(&e), "{path}: {e}");
    }
    let slow = Fetch { timeout: Duration::from_millis(200), ..at(addr, "/slow") };
    assert_eq!(fetch(&slow, &loopback()).await.unwrap_err(), FetchError::Timeout(Duration::from_millis(200)));
}

#[tokio::test]
async fn the_task_fetches_what_is_wanted_and_again_when_it_changes() {
    let current = Arc::new(Mutex::new(JWKS_A));
    let addr = server(current.clone(), Arc::new(Mutex::new(0))).await;
    let (want_tx, want_rx) = watch::channel(BTreeSet::new());
    let (tx, mut rx) = mpsc::channel(8);
    let task = tokio::spawn(run(want_rx, tx, loopback(), BTreeMap::new()));
    let f = at(addr, "/jwks");
    want_tx.send(BTreeSet::from([f.clone()])).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(got, (f.clone(), Some(JWKS_A.to_string())));
    // The issuer rotates its keys: the next refresh brings them.
    *current.lock().unwrap() = JWKS_B;
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(got, (f.clone(), Some(JWKS_B.to_string())));
    // Unchanged refreshes send nothing.
    assert!(tokio::time::timeout(Duration::from_millis(600), rx.recv()).await.is_err());
    drop(want_tx);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task ends with its wanted set").unwrap();
}
