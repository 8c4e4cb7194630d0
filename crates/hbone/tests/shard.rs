//! Shards (`slipstream_hbone::shard`): accepted connections spread over the
//! shard threads, and each shard's tunnels ride its own pooled connection.
//! Its own test binary: shards are started once per process.

mod common;

use slipstream_core::sync::LockExt;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use slipstream_hbone::{copy, shard, ConnectRequest, PoolConfig, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[test]
fn connections_spread_over_shards_and_each_shard_rides_its_own_pooled_connection() {
    // As the node proxy runs: a single-threaded runtime here (shard 0) and
    // one more shard thread.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    shard::start(2).unwrap();
    assert_eq!(shard::count(), 2);
    rt.block_on(async {
        let mesh = Mesh::new();
        let (client, server_id) = (id("sleep"), id("httpbin"));
        let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
        let pool = mesh.pool(PoolConfig::default());
        let k = key(&client, std::slice::from_ref(&server_id), server.addr);

        // A proxy's listener: each accepted connection is handed to a shard,
        // which opens a tunnel for it and copies.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served_on: Arc<Mutex<BTreeMap<u16, usize>>> = Arc::default();
        tokio::spawn({
            let (pool, served_on) = (pool.clone(), served_on.clone());
            async move {
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let (pool, k, served_on) = (pool.clone(), k.clone(), served_on.clone());
                    shard::spawn_accepted(tcp, move |tcp| async move {
                        *served_on.locked().entry(shard::current()).or_default() += 1;
                        let tunnel = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, 8080))).await.unwrap();
                        let (_, r) = copy::bidirectional(tunnel, tcp).await;
                        r.unwrap();
                    });
                }
            }
        });

        // Four clients, all open at once: each is echoed whole.
        let mut clients = Vec::new();
        for i in 0..4u8 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let msg = pattern(100_000, i);
            c.write_all(&msg).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut back)).await.expect("echo in time").unwrap();
            assert_eq!(back, msg, "client {i}");
            clients.push(c);
        }
        assert_eq!(served_on.locked().clone(), BTreeMap::from([(0, 2), (1, 2)]), "round robin over the two shards");
        // One pooled connection per shard, not one shared: the server
        // accepted two, and each shard's tunnels ride its own.
        let mut snapshot = pool.snapshot();
        snapshot.sort_by_key(|s| s.shard);
        let per_shard: Vec<(u16, usize, usize)> =
            snapshot.iter().map(|s| (s.shard, s.connections.len(), s.connections.iter().map(|c| c.active_streams).sum())).collect();
        assert_eq!(per_shard, vec![(0, 1, 2), (1, 1, 2)], "shard, connections, streams");
        assert_eq!(server.stats.snapshot().connections_accepted, 2);
        drop(clients);
    });
}
