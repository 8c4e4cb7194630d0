//! Connection pooling, rollover, idle close, concurrency and drain.

mod common;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::FutureExt;
use http::{Method, Request, StatusCode};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use slipstream_hbone::{ConnectRequest, HboneError, Pool, PoolConfig, PoolKey, ServerConfig, TunnelStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn echo_target() -> SocketAddr {
    SocketAddr::new(LOCALHOST, 8080)
}

async fn echo_once(tunnel: &mut TunnelStream, msg: &[u8]) {
    tunnel.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), tunnel.read_exact(&mut back)).await.expect("echo in time").unwrap();
    assert_eq!(back, msg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_shares_a_connection_other_keys_do_not() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, std::slice::from_ref(&server_id), server.addr);

    let mut a = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    let mut b = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut a, b"a").await;
    echo_once(&mut b, b"b").await;
    assert_eq!(pool.connection_count(), 1);
    assert_eq!(server.stats.snapshot().connections_accepted, 1);
    assert_eq!(pool.snapshot()[0].connections[0].active_streams, 2);
    drop((a, b));

    // Another source identity: another connection.
    let other_src = key(&id("productpage"), std::slice::from_ref(&server_id), server.addr);
    let mut c = pool.connect(&other_src, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut c, b"c").await;
    assert_eq!(pool.connection_count(), 2);

    // Another set of expected identities: another connection; the same set
    // in another order is the same key.
    let wider = key(&client, &[id("waypoint"), server_id.clone()], server.addr);
    let reordered = key(&client, &[server_id.clone(), id("waypoint")], server.addr);
    assert_eq!(wider, reordered);
    let mut d = pool.connect(&wider, ConnectRequest::new(echo_target())).await.unwrap();
    let mut e = pool.connect(&reordered, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut d, b"d").await;
    echo_once(&mut e, b"e").await;
    assert_eq!(pool.connection_count(), 3);

    // Another source IP: another connection.
    let other_ip = PoolKey::new(client.clone(), [server_id], server.addr, "127.0.0.5".parse().unwrap());
    let mut f = pool.connect(&other_ip, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut f, b"f").await;
    assert_eq!(pool.connection_count(), 4);
    assert_eq!(server.stats.snapshot().connections_accepted, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_connection_rolls_over_to_a_new_one() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig { max_streams_per_connection: 2, ..Default::default() });
    let k = key(&client, &[server_id], server.addr);

    let t1 = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    let mut t2 = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    assert_eq!(pool.connection_count(), 1);
    let mut t3 = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    assert_eq!(pool.connection_count(), 2);
    let mut counts: Vec<usize> = pool.snapshot()[0].connections.iter().map(|c| c.active_streams).collect();
    counts.sort();
    assert_eq!(counts, vec![1, 2]);
    echo_once(&mut t2, b"2").await;
    echo_once(&mut t3, b"3").await;

    // A freed slot is reused before any new connection.
    drop(t1);
    let mut t4 = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut t4, b"4").await;
    assert_eq!(pool.connection_count(), 2);
    assert_eq!(server.stats.snapshot().connections_accepted, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_tunnels_through_one_pool() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, &[server_id], server.addr);

    let tasks: Vec<_> = (0..500u32)
        .map(|i| {
            let pool = pool.clone();
            let k = k.clone();
            tokio::spawn(async move {
                let tunnel = pool.connect(&k, ConnectRequest::new(echo_target())).await?;
                let (mut rx, mut tx) = tunnel.into_split();
                let data = pattern(32 * 1024 + i as usize, i as u8);
                let sent = data.clone();
                let writer = tokio::spawn(async move {
                    tx.write_all(&sent).await?;
                    tx.shutdown().await
                });
                let echoed = read_all(&mut rx).await.map_err(HboneError::io)?;
                writer.await.unwrap().map_err(HboneError::io)?;
                assert!(echoed == data, "tunnel {i} delivered its own bytes");
                Ok::<usize, HboneError>(echoed.len())
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += tokio::time::timeout(Duration::from_secs(60), t).await.expect("tunnel finished").unwrap().unwrap();
    }
    assert_eq!(total, (0..500).map(|i| 32 * 1024 + i).sum::<usize>());
    let accepted = server.stats.snapshot().connections_accepted;
    // 100 streams per connection: never more than 500/100 connections
    // (fewer when early tunnels finish before late ones start).
    assert!((1..=5).contains(&accepted), "got {accepted} connections");
    assert_eq!(server.handler.wait_records(500).await.len(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_busy_ones_stay() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig { idle_timeout: Duration::from_millis(300), ..Default::default() });
    let k = key(&client, &[server_id], server.addr);

    // A tunnel held open longer than the idle timeout keeps its connection.
    let mut held = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    // Not synchronization: the window (over twice the idle timeout) in
    // which the busy connection must NOT be closed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    echo_once(&mut held, b"still open").await;
    assert_eq!(pool.connection_count(), 1);
    drop(held);

    // Without streams it closes after the idle timeout.
    wait_until_async("the idle connection to close", WAIT, || pool.connection_count() == 0).await;
    let mut again = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut again, b"new").await;
    assert_eq!(server.stats.snapshot().connections_accepted, 2);
}

async fn raw_connect(
    h2: &h2::client::SendRequest<Bytes>,
    target: SocketAddr,
) -> Result<(StatusCode, h2::SendStream<Bytes>, h2::RecvStream), h2::Error> {
    let mut send = h2.clone().ready().await?;
    let request = Request::builder().method(Method::CONNECT).uri(target.to_string()).body(()).unwrap();
    let (response, stream) = send.send_request(request, false)?;
    let response = response.await?;
    Ok((response.status(), stream, response.into_body()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_sends_goaway_and_lets_open_streams_finish() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let mut server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, std::slice::from_ref(&server_id), server.addr);
    let mut pooled = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut pooled, b"before").await;

    let raw = raw_h2(&mesh, &client, server.addr, &server_id).await;
    let (status, mut raw_tx, mut raw_rx) = raw_connect(&raw, echo_target()).await.unwrap();
    assert_eq!(status, StatusCode::OK);

    let drained = tokio::spawn(server.drain.take().unwrap().drain(Duration::from_secs(10)));
    // The drain reached both: the listener is closed and the raw client
    // has the GOAWAY (h2 then fails `ready()` without opening a stream).
    wait_until_async("the listener to close and the raw client to get GOAWAY", WAIT, || {
        server.task.is_finished() && matches!(raw.clone().ready().now_or_never(), Some(Err(_)))
    })
    .await;
    // The pooled connection got its GOAWAY at the same time; a round trip on
    // its open stream makes sure the pool has read it: the server queued the
    // GOAWAY when the drain began, before this echo, and h2 delivers frames
    // in order.
    echo_once(&mut pooled, b"drain started").await;

    // GOAWAY: the raw connection takes no new stream...
    let refused = raw_connect(&raw, echo_target()).await.map(|r| r.0).unwrap_err();
    assert!(refused.is_go_away(), "refused by GOAWAY: {refused}");
    assert_eq!(refused.reason(), Some(h2::Reason::NO_ERROR));
    // ...nor does the pool, which retries on a new connection and finds the
    // listener closed.
    let err = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap_err();
    assert!(matches!(err, HboneError::Connect { .. }), "got {err}");

    // The open streams still work and finish normally.
    echo_once(&mut pooled, b"after drain started").await;
    raw_tx.send_data(Bytes::from_static(b"raw"), true).unwrap();
    let mut echoed = Vec::new();
    while let Some(chunk) = raw_rx.data().await {
        let chunk = chunk.unwrap();
        let _ = raw_rx.flow_control().release_capacity(chunk.len());
        echoed.extend_from_slice(&chunk);
    }
    assert_eq!(echoed, b"raw");
    assert!(!drained.is_finished(), "one stream is still open");

    pooled.shutdown().await.unwrap();
    read_all(&mut pooled).await.unwrap();
    drop(pooled);
    tokio::time::timeout(Duration::from_secs(5), drained).await.expect("drain completes once the streams are done").unwrap();
    assert_eq!(server.stats.snapshot().drain_forced_closes, 0);
    assert!(server.task.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_deadline_closes_what_is_left() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let mut server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, &[server_id], server.addr);
    let mut tunnel = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut tunnel, b"x").await;

    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), server.drain.take().unwrap().drain(Duration::from_millis(300)))
        .await
        .expect("the deadline ends the drain");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(server.stats.snapshot().drain_forced_closes, 1);
    // The forcibly closed tunnel ends for the client too.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(2), tunnel.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "tunnel ended");
}

/// The node proxy creates the sockets (bound, marked, in a namespace): the
/// pool calls its connector with the destination and the source IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_come_from_the_callers_connector() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let calls = Arc::new(Mutex::new(Vec::<(SocketAddr, IpAddr)>::new()));
    let seen = calls.clone();
    let connector = move |dst: SocketAddr, src: IpAddr| {
        seen.locked().push((dst, src));
        async move { tokio::net::TcpStream::connect(dst).await }
    };
    let pool = Pool::new(PoolConfig::default(), Arc::new(mesh.certs.clone()), Arc::new(connector));
    let src_ip: IpAddr = "10.244.1.7".parse().unwrap();
    let k = PoolKey::new(client, [server_id], server.addr, src_ip);
    let mut t = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap();
    echo_once(&mut t, b"via connector").await;
    assert_eq!(*calls.locked(), vec![(server.addr, src_ip)]);

    // A connector failure is a connect error.
    let failures = Arc::new(AtomicUsize::new(0));
    let counted = failures.clone();
    let refusing = move |_dst: SocketAddr, _src: IpAddr| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied)) }
    };
    let pool = Pool::new(PoolConfig::default(), Arc::new(mesh.certs.clone()), Arc::new(refusing));
    let err = pool.connect(&k, ConnectRequest::new(echo_target())).await.unwrap_err();
    assert!(matches!(err, HboneError::Connect { .. }), "got {err}");
    assert_eq!(err.flag().as_str(), "CONNECT");
    assert_eq!(failures.load(Ordering::SeqCst), 1);
}

/// Callers waiting on one dial share its outcome: one failed dial, one error each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_dial() {
    let mesh = Mesh::new();
    let client = id("sleep");
    let dials = Arc::new(AtomicUsize::new(0));
    let counted = dials.clone();
    let slow_refusal = move |_dst: SocketAddr, _src: IpAddr| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            // Not synchronization: a slow dial, so that the 20 callers
            // arrive while it is still in flight.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        }
    };
    let pool = Pool::new(PoolConfig::default(), Arc::new(mesh.certs.clone()), Arc::new(slow_refusal));
    let k = key(&client, &[id("httpbin")], "127.0.0.1:15008".parse().unwrap());
    let attempts: Vec<_> = (0..20)
        .map(|_| {
            let (pool, k) = (pool.clone(), k.clone());
            tokio::spawn(async move { pool.connect(&k, ConnectRequest::new(echo_target())).await })
        })
        .collect();
    for a in attempts {
        assert!(matches!(a.await.unwrap(), Err(HboneError::Connect { .. })));
    }
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    assert_eq!(pool.connection_count(), 0);
}
