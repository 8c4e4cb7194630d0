//! The CNI plugin `slipstream-cni`, chained after the cluster's primary CNI
//! (the runtime runs the `slipstream` binary under that name). It decides
//! nothing: it tells the node agent of its node about the pod and waits for
//! its answer (`crate::agent::server`), so that on ADD the pod's first
//! container starts only once its capture is installed and the node proxy
//! listens in its namespace.
//!
//! - ADD: the agent's answer, then the primary's result passed through
//!   unchanged. No answer (the agent is being upgraded, or not there yet)
//!   fails ADD: the kubelet retries, and the pod waits instead of starting
//!   outside the mesh.
//! - DEL: the agent is told, best effort; DEL always succeeds (the agent
//!   also releases pods it sees deleted from the API).
//! - CHECK, GC: nothing to check of ours. STATUS: whether the agent answers.
//!   VERSION: the versions we speak.
//!
//! The CNI protocol (the spec's environment variables, JSON on stdin and
//! stdout, errors as JSON with a code) is written here rather than taken
//! from `cni-plugin` (last released 2021) or `rscni-plugin` (young): a
//! chained plugin that changes nothing must hand back the primary's result
//! as it came, fields newer than any library's types included, and that is
//! a `serde_json::Value` passed through, not a typed result re-serialised.

use crate::protocol::{Command, Reply, Request};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::time::Duration;

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// How long ADD waits for the agent: it answers once the pod is served.
const ADD_TIMEOUT: Duration = Duration::from_secs(60);
const DEL_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SOCKET: &str = "/var/run/slipstream/cni.sock";

/// A CNI error: its code (the spec's: 7 invalid configuration, 11 try
/// again later, 999 other) and message.
#[derive(Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    fn config(msg: impl Into<String>) -> CniError {
        CniError { code: 7, msg: msg.into(), details: String::new() }
    }
    fn try_later(msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError { code: 11, msg: msg.into(), details: details.into() }
    }
}

/// What one call asks, from the environment and the configuration.
#[derive(Debug, PartialEq, Eq)]
pub struct Call {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    /// `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID` from CNI_ARGS.
    pub pod: Option<(String, String, String)>,
    pub cni_version: String,
    pub socket: String,
    pub prev_result: Option<Value>,
}

/// Reads a call from the environment's values and the configuration text.
pub fn parse_call(env: impl Fn(&str) -> Option<String>, stdin: &str) -> Result<Call, CniError> {
    let command = env("CNI_COMMAND")
        .ok_or_else(|| CniError::config("CNI_COMMAND is not set: slipstream-cni is run by a container runtime, not by hand"))?;
    if command == "VERSION" {
        return Ok(Call {
            command,
            container_id: String::new(),
            netns: String::new(),
            pod: None,
            cni_version: String::new(),
            socket: String::new(),
            prev_result: None,
        });
    }
    let conf: Value =
        serde_json::from_str(stdin).map_err(|e| CniError::config(format!("the network configuration on stdin is not JSON: {e}")))?;
    let args = env("CNI_ARGS").unwrap_or_default();
    let arg = |k: &str| args.split(';').find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))).map(str::to_string);
    let pod = match (arg("K8S_POD_NAMESPACE"), arg("K8S_POD_NAME")) {
        (Some(ns), Some(name)) => Some((ns, name, arg("K8S_POD_UID").unwrap_or_default())),
        _ => None,
    };
    Ok(Call {
        command,
        container_id: env("CNI_CONTAINERID").unwrap_or_default(),
        netns: env("CNI_NETNS").unwrap_or_default(),
        pod,
        cni_version: conf.get("cniVersion").and_then(Value::as_str).unwrap_or("1.0.0").to_string(),
        socket: conf.get("agentSocket").and_then(Value::as_str).unwrap_or(DEFAULT_SOCKET).to_string(),
        prev_result: conf.get("prevResult").cloned(),
    })
}

/// The pod's addresses in the primary CNI's result.
pub fn result_ips(prev: &Value) -> Vec<IpAddr> {
    let list = prev.get("ips").and_then(Value::as_array).cloned().unwrap_or_default();
    list.iter()
        .filter_map(|ip| ip.get("address").and_then(Value::as_str))
        .filter_map(|a| a.split('/').next().and_then(|a| a.parse().ok()))
        .collect()
}

/// Asks the agent, one JSON line each way.
pub fn ask(socket: &str, req: &Request, timeout: Duration) -> Result<Reply, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("the node agent's socket {socket} does not answer: {e}"))?;
    s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    line.push(b'\n');
    s.write_all(&line).map_err(|e| format!("writing to {socket}: {e}"))?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).map_err(|e| format!("no answer from the node agent within {timeout:?}: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("the node agent's answer is not understood ({e}): {answer:?}"))
}

/// Runs one call: Ok(what to print on stdout).
pub fn handle(call: &Call, asker: impl Fn(&str, &Request, Duration) -> Result<Reply, String>) -> Result<Option<Value>, CniError> {
    match call.command.as_str() {
        "VERSION" => Ok(Some(json!({"cniVersion": "1.1.0", "supportedVersions": VERSIONS}))),
        "ADD" => {
            let Some(prev) = &call.prev_result else {
                return Err(CniError::config("no prevResult: slipstream-cni is chained after the primary CNI in a .conflist, never alone"));
            };
            let mut out = prev.clone();
            out["cniVersion"] = json!(call.cni_version);
            let Some((namespace, name, uid)) = &call.pod else {
                // Not a Kubernetes pod: nothing of ours to do.
                return Ok(Some(out));
            };
            let req = request(call, Command::Add, namespace, name, uid, result_ips(prev));
            match asker(&call.socket, &req, ADD_TIMEOUT) {
                Ok(r) if r.ok => Ok(Some(out)),
                Ok(r) => Err(CniError { code: 999, msg: format!("pod {namespace}/{name}: the node agent refused it"), details: r.message }),
                Err(e) => Err(CniError::try_later(
                    format!("pod {namespace}/{name} waits for the slipstream node agent (it must be meshed, never unmeshed)"),
                    e,
                )),
            }
        }
        "DEL" => {
            if let Some((namespace, name, uid)) = &call.pod {
                let req = request(call, Command::Del, namespace, name, uid, Vec::new());
                if let Err(e) = asker(&call.socket, &req, DEL_TIMEOUT) {
                    eprintln!("slipstream-cni: DEL of {namespace}/{name}: {e} (the agent releases it from its watch)");
                }
            }
            Ok(None)
        }
        "STATUS" => {
            UnixStream::connect(&call.socket).map_err(|e| CniError {
                code: 50,
                msg: "the slipstream node agent is not answering".into(),
                details: e.to_string(),
            })?;
            Ok(None)
        }
        "CHECK" | "GC" => Ok(None),
        other => Err(CniError { code: 4, msg: format!("unknown CNI_COMMAND {other:?}"), details: String::new() }),
    }
}

fn request(call: &Call, command: Command, namespace: &str, name: &str, uid: &str, ips: Vec<IpAddr>) -> Request {
    Request {
        command,
        container_id: call.container_id.clone(),
        netns: call.netns.clone(),
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
        ips,
    }
}

/// The plugin's process: the runtime's environment and stdin in, the
/// result or a CNI error on stdout, exit status 0 or 1.
pub fn main() -> ! {
    let mut stdin = String::new();
    let _ = std::io::stdin().read_to_string(&mut stdin);
    let outcome = parse_call(|k| std::env::var(k).ok(), &stdin).and_then(|call| handle(&call, ask).map(|out| (call, out)));
    match outcome {
        Ok((_, Some(out))) => {
            println!("{out}");
            std::process::exit(0)
        }
        Ok((_, None)) => std::process::exit(0),
        Err(e) => {
            let version =
                serde_json::from_str::<Value>(&stdin).ok().and_then(|c| c.get("cniVersion").and_then(Value::as_str).map(str::to_string));
            println!(
                "{}",
                json!({"cniVersion": version.unwrap_or_else(|| "1.0.0".into()), "code": e.code, "msg": e.msg, "details": e.details})
            );
            eprintln!("slipstream-cni: {}: {}", e.msg, e.details);
            std::process::exit(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(cmd: &str) -> HashMap<&'static str, String> {
        let mut m = HashMap::new();
        m.insert("CNI_COMMAND", cmd.to_string());
        m.insert("CNI_CONTAINERID", "abc".to_string());
        m.insert("CNI_NETNS", "/var/run/netns/cni-1".to_string());
        m.insert("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=bookinfo;K8S_POD_NAME=ratings-v1-x;K8S_POD_UID=u-1".to_string());
        m
    }
    const CONF: &str = r#"{"cniVersion":"1.0.0","name":"k","type":"slipstream-cni","agentSocket":"/s.sock",
        "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.78.1.5/24","gateway":"10.78.1.1"}],"interfaces":[{"name":"eth0"}]}}"#;

    fn call(cmd: &str, conf: &str) -> Call {
        let e = env(cmd);
        parse_call(|k| e.get(k).cloned(), conf).unwrap()
    }

    #[test]
    fn add_asks_the_agent_and_passes_the_primary_result_through() {
        let c = call("ADD", CONF);
        assert_eq!(c.pod, Some(("bookinfo".into(), "ratings-v1-x".into(), "u-1".into())));
        assert_eq!(c.socket, "/s.sock");
        let out = handle(&c, |sock, req, _| {
            assert_eq!(sock, "/s.sock");
            assert_eq!(
                (req.command, req.netns.as_str(), req.ips.clone()),
                (Command::Add, "/var/run/netns/cni-1", vec!["10.78.1.5".parse().unwrap()])
            );
            Ok(Reply::ok("served"))
        })
        .unwrap()
        .unwrap();
        assert_eq!(out["ips"][0]["address"], "10.78.1.5/24");
    }

    #[test]
    fn add_fails_closed_when_the_agent_is_away_or_refuses() {
        let c = call("ADD", CONF);
        let e = handle(&c, |_, _, _| Err("connection refused".into())).unwrap_err();
        assert_eq!(e.code, 11, "try again later: the kubelet retries");
        assert!(e.msg.contains("bookinfo/ratings-v1-x") && e.details.contains("connection refused"), "{e:?}");
        let e = handle(&c, |_, _, _| Ok(Reply::refused("listeners not bound within 30s"))).unwrap_err();
        assert!(e.details.contains("listeners not bound"), "{e:?}");
    }

    #[test]
    fn add_without_a_primary_or_a_pod() {
        let e = handle(&call("ADD", r#"{"cniVersion":"1.0.0"}"#), |_, _, _| unreachable!()).unwrap_err();
        assert_eq!(e.code, 7);
        let mut plain = env("ADD");
        plain.insert("CNI_ARGS", String::new());
        let c = parse_call(|k| plain.get(k).cloned(), CONF).unwrap();
        assert!(handle(&c, |_, _, _| unreachable!("not a pod: the agent is not asked")).unwrap().is_some());
    }

    #[test]
    fn del_always_succeeds_and_version_answers() {
        assert_eq!(handle(&call("DEL", CONF), |_, _, _| Err("gone".into())).unwrap(), None);
        let v = handle(&call("VERSION", ""), |_, _, _| unreachable!()).unwrap().unwrap();
        assert!(v["supportedVersions"].as_array().unwrap().iter().any(|x| x == "1.0.0"));
        assert!(parse_call(|_| None, "").unwrap_err().msg.contains("CNI_COMMAND"));
        assert!(parse_call(|k| (k == "CNI_COMMAND").then(|| "ADD".into()), "not json").unwrap_err().msg.contains("not JSON"));
    }
}
