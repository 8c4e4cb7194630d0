//! The primary CNI's configuration with our plugin chained at its end, and
//! without it again. Pure over the file's text: the agent reads and writes
//! the files (`agent::install`).
//!
//! The runtime (containerd, CRI-O) uses the first configuration of its
//! directory in name order; that is the one we chain into. A `.conf` (one
//! plugin, no list) cannot be chained: the agent says so and waits for a
//! `.conflist` (every CNI this is meant for writes one).

use serde_json::{json, Map, Value};

/// Our plugin's `type`: the binary's name in the CNI bin directory.
pub const PLUGIN_TYPE: &str = "slipstream-cni";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConflistError {
    #[error("{file}: not JSON: {detail}")]
    NotJson { file: String, detail: String },
    #[error("{file}: field `plugins`: missing or not a list (a `.conf` file cannot be chained; the primary CNI must write a `.conflist`)")]
    NoPlugins { file: String },
}

/// Our entry in the chain.
pub fn entry(agent_socket: &str) -> Value {
    json!({"type": PLUGIN_TYPE, "agentSocket": agent_socket})
}

/// The configuration the runtime uses: the first `.conflist` or `.conf`
/// (or `.json`) in name order.
pub fn primary(names: &[String]) -> Option<&String> {
    let mut v: Vec<&String> = names.iter().filter(|n| n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json")).collect();
    v.sort();
    v.first().copied()
}

fn plugins<'a>(file: &str, doc: &'a mut Value) -> Result<&'a mut Vec<Value>, ConflistError> {
    doc.get_mut("plugins").and_then(Value::as_array_mut).ok_or_else(|| ConflistError::NoPlugins { file: file.into() })
}

fn parse(file: &str, text: &str) -> Result<Value, ConflistError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ConflistError::NotJson { file: file.into(), detail: e.to_string() })?;
    if v.as_object().is_none() {
        return Err(ConflistError::NotJson { file: file.into(), detail: "not an object".into() });
    }
    Ok(v)
}

fn render(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).unwrap_or_default() + "\n"
}

/// The conflist with our `entry` last in its chain; None when it already is.
pub fn with_plugin(file: &str, text: &str, entry: &Value) -> Result<Option<String>, ConflistError> {
    let mut doc = parse(file, text)?;
    let list = plugins(file, &mut doc)?;
    let ours: Vec<usize> = list.iter().enumerate().filter(|(_, p)| is_ours(p)).map(|(i, _)| i).collect();
    if ours.len() == 1 && ours[0] == list.len() - 1 && list[ours[0]] == *entry {
        return Ok(None);
    }
    list.retain(|p| !is_ours(p));
    list.push(entry.clone());
    Ok(Some(render(&doc)))
}

/// The conflist without our entry; None when it has none.
pub fn without_plugin(file: &str, text: &str) -> Result<Option<String>, ConflistError> {
    let mut doc = parse(file, text)?;
    let list = plugins(file, &mut doc)?;
    let before = list.len();
    list.retain(|p| !is_ours(p));
    Ok((list.len() != before).then(|| render(&doc)))
}

fn is_ours(p: &Value) -> bool {
    p.as_object().and_then(|o: &Map<String, Value>| o.get("type")).and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE: &str = r#"{"cniVersion":"1.0.0","name":"k","plugins":[{"type":"bridge","bridge":"cni0"}]}"#;

    #[test]
    fn chains_last_once_and_unchains() {
        let e = entry("/var/run/slipstream/cni.sock");
        let with = with_plugin("10.conflist", BRIDGE, &e).unwrap().expect("added");
        let doc: Value = serde_json::from_str(&with).unwrap();
        assert_eq!(doc["plugins"][0]["type"], "bridge", "the primary stays first");
        assert_eq!(doc["plugins"][1], e);
        assert_eq!(with_plugin("10.conflist", &with, &e).unwrap(), None, "already there: no rewrite");
        let other = entry("/elsewhere.sock");
        let moved = with_plugin("10.conflist", &with, &other).unwrap().expect("replaced");
        assert_eq!(serde_json::from_str::<Value>(&moved).unwrap()["plugins"].as_array().unwrap().len(), 2, "replaced, not added twice");
        let without = without_plugin("10.conflist", &with).unwrap().expect("removed");
        assert_eq!(serde_json::from_str::<Value>(&without).unwrap(), serde_json::from_str::<Value>(BRIDGE).unwrap());
        assert_eq!(without_plugin("10.conflist", BRIDGE).unwrap(), None);
    }

    #[test]
    fn a_primary_that_rewrote_its_file_gets_us_back_at_the_end() {
        let e = entry("/s");
        let ours_first = r#"{"plugins":[{"type":"slipstream-cni","agentSocket":"/s"},{"type":"calico"}]}"#;
        let fixed: Value = serde_json::from_str(&with_plugin("c", ours_first, &e).unwrap().unwrap()).unwrap();
        assert_eq!(fixed["plugins"][0]["type"], "calico");
        assert_eq!(fixed["plugins"][1]["type"], PLUGIN_TYPE);
    }

    #[test]
    fn what_cannot_be_chained_says_why() {
        let e = entry("/s");
        assert!(matches!(with_plugin("a.conf", r#"{"type":"bridge"}"#, &e), Err(ConflistError::NoPlugins { .. })));
        assert!(matches!(with_plugin("a.conflist", "{", &e), Err(ConflistError::NotJson { .. })));
        assert!(with_plugin("a.conflist", "{", &e).unwrap_err().to_string().starts_with("a.conflist: not JSON"));
    }

    #[test]
    fn the_runtime_uses_the_first_by_name() {
        let names: Vec<String> = ["99-x.conflist", "10-kube.conflist", "README", "05-a.conf.bak"].iter().map(|s| s.to_string()).collect();
        assert_eq!(primary(&names).map(String::as_str), Some("10-kube.conflist"));
        assert_eq!(primary(&[]), None);
    }
}
