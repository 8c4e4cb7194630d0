//! `label` and `annotate`: changes through the agent's checks.

use super::kinds::kind;
use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::ipc::{Request, Response};
use std::time::Duration;

/// `key=value` sets, `key-` removes (label and annotate).
pub fn changes(args: &[String]) -> Result<Vec<(String, Option<String>)>, String> {
    if args.is_empty() {
        return Err("at least one label update is required".into());
    }
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), Some(v.to_string()))),
            None if a.ends_with('-') && a.len() > 1 => Ok((a[..a.len() - 1].to_string(), None)),
            _ => Err(format!("invalid label spec: {a:?} (use key=value to set, key- to remove)")),
        })
        .collect()
}

/// `label` and `annotate`: `KIND NAME k=v k-` or `KIND/NAME k=v`.
pub fn label(ctx: &Ctx, args: &[String], namespace: Option<&str>, overwrite: bool, annotate: bool) -> anyhow::Result<()> {
    common::require_root(if annotate { "annotate" } else { "label" })?;
    let (k, name, rest) = match args {
        [first, rest @ ..] if first.contains('/') => {
            let (k, n) = first.split_once('/').unwrap_or_default();
            (kind(k).map_err(anyhow::Error::msg)?, n.to_string(), rest)
        }
        [k, n, rest @ ..] => (kind(k).map_err(anyhow::Error::msg)?, n.clone(), rest),
        _ => bail!("you must specify a resource, its name and at least one {}", if annotate { "annotation" } else { "label" }),
    };
    let changes = changes(rest).map_err(anyhow::Error::msg)?;
    let ns = if k.namespaced { namespace.unwrap_or("default").to_string() } else { String::new() };
    let req = Request::Label { kind: k.kind.to_string(), namespace: ns, name, changes, overwrite, annotate };
    match ctx.call(&req, Duration::from_secs(30))? {
        Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
        Response::Rejected { errors } => bail!("{}", errors.join("\n")),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    // As after an apply: the node proxies hold the change when it returns.
    crate::cmd::proxy_status::wait_acked_quietly(ctx, Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn label_changes() {
        assert_eq!(
            changes(&s(&["a=b", "c-", "d="])),
            Ok(vec![("a".into(), Some("b".into())), ("c".into(), None), ("d".into(), Some(String::new()))])
        );
        assert!(changes(&s(&["novalue"])).is_err());
        assert!(changes(&[]).is_err());
    }
}
