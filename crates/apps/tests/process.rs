//! `run_echo` / `run_bookinfo` as the CLI calls them: own runtime, real
//! ports, and a clean `Ok(())` on SIGTERM/SIGINT. A separate test binary
//! with a single test, because the signals are sent to this whole process.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::Command;
use std::thread;
use std::time::Duration;

use clap::Parser;
use common::wait_until;
use slipstream_apps::{run_bookinfo, run_echo, BookinfoArgs, EchoArgs};

mod common;

#[derive(Parser)]
struct EchoCli {
    #[command(flatten)]
    args: EchoArgs,
}

#[derive(Parser)]
struct BookinfoCli {
    #[command(flatten)]
    args: BookinfoArgs,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits for the server to accept; `run_until_signal` installs its signal
/// handlers before binding, so once this succeeds a signal is safe to send.
fn wait_for(addr: SocketAddr) {
    wait_until(format_args!("{addr} to accept connections"), Duration::from_secs(20), || TcpStream::connect(addr).is_ok());
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

fn signal_self(signal: &str) {
    let status = Command::new("kill").args([signal, &std::process::id().to_string()]).status().expect("run kill");
    assert!(status.success());
}

fn join_within<T>(handle: thread::JoinHandle<T>, limit: Duration) -> T {
    wait_until("the app to stop after the signal", limit, || handle.is_finished());
    handle.join().unwrap()
}

#[test]
fn apps_serve_until_sigterm_or_sigint_and_return_ok() {
    // echo: HTTP and TCP echo on real ports, stopped by SIGTERM.
    let (http_port, tcp_port) = (free_port(), free_port());
    let argv = [
        "echo",
        "--bind",
        "127.0.0.1",
        "--http-port",
        &http_port.to_string(),
        "--tcp-port",
        &tcp_port.to_string(),
        "--name",
        "proc-test",
        "--quiet",
    ];
    let args = EchoCli::parse_from(argv).args;
    let echo = thread::spawn(move || run_echo(args));
    let http: SocketAddr = ([127, 0, 0, 1], http_port).into();
    let tcp: SocketAddr = ([127, 0, 0, 1], tcp_port).into();
    wait_for(http);
    wait_for(tcp);
    let answer = http_get(http, "/headers");
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("\"server\": \"proc-test\""), "{answer}");
    let mut stream = TcpStream::connect(tcp).unwrap();
    stream.write_all(b"ping").unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).unwrap();
    assert_eq!(echoed, b"ping");
    signal_self("-TERM");
    join_within(echo, Duration::from_secs(10)).expect("run_echo returns Ok on SIGTERM");

    // bookinfo: a details service, stopped by SIGINT.
    let port = free_port();
    let args =
        BookinfoCli::parse_from(["bookinfo", "--role", "details", "--bind", "127.0.0.1", "--port", &port.to_string(), "--quiet"]).args;
    let details = thread::spawn(move || run_bookinfo(args));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_for(addr);
    let answer = http_get(addr, "/details/0");
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("x-served-by: details-v1"), "{answer}");
    signal_self("-INT");
    join_within(details, Duration::from_secs(10)).expect("run_bookinfo returns Ok on SIGINT");

    // A port conflict fails startup instead of serving half the app.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port().to_string();
    let args =
        EchoCli::parse_from(["echo", "--bind", "127.0.0.1", "--http-port", &free_port().to_string(), "--tcp-port", &taken_port]).args;
    let err = run_echo(args).unwrap_err();
    assert!(format!("{err:#}").contains("TCP echo listener"), "{err:#}");
}
