//! Against a real HTTP server on loopback (allowed here by the setting
//! that is off by default, which the first test checks), standing for the
//! Service the URL names: the fetch goes to the address it is given, as
//! the index resolves the Service, never to a DNS answer.

use super::*;
use slipstream_core::sync::LockExt;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const JWKS_A: &str = r#"{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}"#;
const JWKS_B: &str = r#"{"keys":[{"kty":"EC","kid":"b","crv":"P-256","x":"AA","y":"AA"}]}"#;

/// Serves /jwks (the text in `current`), /redirect, /big, /slow and
/// /html; counts the requests.
async fn server(current: Arc<Mutex<&'static str>>, hits: Arc<Mutex<usize>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let current = current.clone();
            *hits.locked() += 1;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body): (&str, String) = match path.as_str() {
                    "/jwks" => ("200 OK", current.locked().to_string()),
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

fn at(path: &str) -> Fetch {
    Fetch {
        url: format!("http://keys.auth.svc.cluster.local{path}"),
        namespace: "auth".into(),
        service: "keys".into(),
        port: 80,
        tls: false,
        timeout: Duration::from_secs(2),
    }
}

fn loopback() -> FetchSettings {
    FetchSettings { allow_loopback: true, refresh: Duration::from_millis(200), retry: Duration::from_millis(50) }
}

#[tokio::test]
async fn loopback_link_local_and_unspecified_are_never_fetched_by_default() {
    let hits = Arc::new(Mutex::new(0));
    let addr = server(Arc::new(Mutex::new(JWKS_A)), hits.clone()).await;
    let e = fetch(&at("/jwks"), addr, &FetchSettings::default()).await.unwrap_err();
    assert_eq!(e, FetchError::Refused { addr });
    assert_eq!(*hits.locked(), 0, "refused before connecting");
    // Refused whatever the setting (no packet is sent to any of them).
    for a in ["169.254.169.254:80", "[::ffff:169.254.169.254]:80", "0.0.0.0:80", "[fe80::1]:80", "224.0.0.1:80"] {
        let a: SocketAddr = a.parse().unwrap();
        assert_eq!(fetch(&at("/jwks"), a, &loopback()).await.unwrap_err(), FetchError::Refused { addr: a });
    }
    assert!(refused_address("127.0.0.1".parse().unwrap(), false));
    assert!(!refused_address("10.96.0.10".parse().unwrap(), false), "cluster addresses are where the keys are");
    // A Service the index could not resolve is no address.
    let r = fetch_all(&BTreeMap::from([(at("/jwks"), Err("no Service auth/keys".to_string()))]), &loopback(), Duration::from_secs(1)).await;
    assert_eq!(r, [(at("/jwks"), None)]);
}

#[tokio::test]
async fn a_jwks_from_the_address_of_its_service() {
    let addr = server(Arc::new(Mutex::new(JWKS_A)), Arc::new(Mutex::new(0))).await;
    assert_eq!(fetch(&at("/jwks"), addr, &loopback()).await.unwrap(), JWKS_A);
    let r = fetch_all(&BTreeMap::from([(at("/jwks"), Ok(addr))]), &loopback(), Duration::from_secs(1)).await;
    assert_eq!(r, [(at("/jwks"), Some(JWKS_A.to_string()))]);
}

/// Whether an error is the one a case expects.
type Check = fn(&FetchError) -> bool;

#[tokio::test]
async fn what_is_not_a_key_set_is_refused_with_the_reason() {
    let addr = server(Arc::new(Mutex::new(JWKS_A)), Arc::new(Mutex::new(0))).await;
    let cases: [(&str, Check); 4] = [
        ("/redirect", |e| matches!(e, FetchError::Status { status: 302 }) && e.to_string().contains("redirects are not followed")),
        ("/big", |e| matches!(e, FetchError::TooLarge)),
        ("/html", |e| matches!(e, FetchError::NotJwks(_))),
        ("/missing", |e| matches!(e, FetchError::Status { status: 404 })),
    ];
    for (path, ok) in cases {
        let e = fetch(&at(path), addr, &loopback()).await.unwrap_err();
        assert!(ok(&e), "{path}: {e}");
    }
    let slow = Fetch { timeout: Duration::from_millis(200), ..at("/slow") };
    assert_eq!(fetch(&slow, addr, &loopback()).await.unwrap_err(), FetchError::Timeout(Duration::from_millis(200)));
}

#[tokio::test]
async fn the_task_fetches_what_is_wanted_when_its_service_comes_and_again_when_the_keys_change() {
    let current = Arc::new(Mutex::new(JWKS_A));
    let addr = server(current.clone(), Arc::new(Mutex::new(0))).await;
    let f = at("/jwks");
    // Wanted before its Service exists: retried, then fetched at once
    // when the Service comes (not after the grown wait).
    let settings = FetchSettings { retry: Duration::from_secs(30), ..loopback() };
    let (want_tx, want_rx) = watch::channel(Wanted::new());
    let (tx, mut rx) = mpsc::channel(8);
    let task = tokio::spawn(run(want_rx, tx, settings, BTreeMap::new()));
    want_tx.send(BTreeMap::from([(f.clone(), Err("no Service auth/keys".to_string()))])).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    want_tx.send(BTreeMap::from([(f.clone(), Ok(addr))])).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(got, (f.clone(), Some(JWKS_A.to_string())));
    // The issuer rotates its keys: the next refresh brings them.
    *current.locked() = JWKS_B;
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(got, (f.clone(), Some(JWKS_B.to_string())));
    // Unchanged refreshes send nothing.
    assert!(tokio::time::timeout(Duration::from_millis(600), rx.recv()).await.is_err());
    drop(want_tx);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task ends with its wanted set").unwrap();
}
